"""Engines and references that several test modules build alike: an engine with its decode step
compiled (compiled_engine.py) and transformers' own load of the default model (hf_gguf.py)."""
