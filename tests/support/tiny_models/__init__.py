"""Tiny models written to disk for tests: transformers' own folders (hf_folders.py, behind the
`tiny_hf_model` fixture), sentence-transformers folders (st_folders.py, `st_folder`), the same
weights as a GGUF as llama.cpp writes one (gguf_export.py), and LoRA adapters peft makes for them
(lora_adapters.py, with the `lora_setup` fixture's set)."""
