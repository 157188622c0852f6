"""Tiny models written to disk in other formats than transformers' own (a GGUF as llama.cpp writes one)."""
