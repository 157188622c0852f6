"""Tokenizers from GGUF metadata or a Hugging Face folder (tokenizer.py), with their chat templates
(chat_template.py)."""
