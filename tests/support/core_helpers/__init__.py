"""Helpers that several test modules of one part of rillet.core share: the attention steps the
flashinfer backend's tests feed it (attention_steps.py) and the stand-in `flashinfer` module they
run it on (fake_flashinfer.py), the sampler tests' rows (sampler_rows.py) and the texts the
tokenizer tests encode (tokenizer_texts.py)."""
