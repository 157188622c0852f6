"""The `ours` fixture of the tokenizer tests: the default model's tokenizer, read from its GGUF
file (~0.2 s: built once per module that asks for it)."""

from __future__ import annotations

import pytest
from rillet.core.loaders.default_model import default_model_path
from rillet.core.tokenizer.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    return Tokenizer.from_gguf(default_model_path())
