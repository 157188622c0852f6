"""Reading model files: GGUF (header parser, dequantization, weights) and Hugging Face folders
(config.json + safetensors), the converted-weights cache, and where the default model lives."""
