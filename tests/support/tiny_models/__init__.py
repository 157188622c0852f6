"""Tiny models written to disk in other formats than transformers' own (a GGUF as llama.cpp writes one),
and LoRA adapters peft makes for them (lora_adapters.py)."""
