"""The default model's tokenizer against transformers: ids, text, vocabulary facts, the chat
template, and the same tokenizer saved as a transformers folder.

The reference is `AutoTokenizer.from_pretrained(dir, gguf_file=...)` on the same GGUF file (the
`theirs` fixture, loaded once for this module, ~4 s: the only module that uses it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from core_helpers.tokenizer_texts import TEXTS
from harness.hf_gguf import hf_default_tokenizer
from rillet.core.tokenizer.gguf import bytes_to_unicode
from rillet.core.tokenizer.tokenizer import Tokenizer

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
        {"role": "user", "content": "Why? 😀\n  (multi-line)"},
    ],
    [{"role": "system", "content": ""}, {"role": "user", "content": "日本語"}],
]


@pytest.fixture(scope="module")
def theirs() -> Any:
    return hf_default_tokenizer()


def test_encode_matches_transformers(ours: Tokenizer, theirs: Any) -> None:
    for text in TEXTS:
        for special in (True, False):
            want = theirs.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == want, text


def test_decode_matches_transformers(ours: Tokenizer, theirs: Any) -> None:
    for text in TEXTS:
        ids = ours.encode(text)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    assert ours.decode(ours.encode("<|im_start|>user\nhi<|im_end|>")) == "user\nhi"


def test_vocabulary_facts(ours: Tokenizer, theirs: Any) -> None:
    from transformers.convert_slow_tokenizer import bytes_to_unicode as hf_bytes_to_unicode

    assert bytes_to_unicode() == hf_bytes_to_unicode()
    assert ours.eos_token_ids == (2,) and ours.bos_token_id == 1
    assert ours.id_to_token(2) == "<|im_end|>" == theirs.eos_token
    assert ours.special_token_ids == frozenset(theirs.all_special_ids) | frozenset(range(17))
    assert ours.id_to_token(19556) == theirs.convert_ids_to_tokens(19556)
    assert ours.token_bytes(905) == b" world"


def test_chat_template_matches_transformers(ours: Tokenizer, theirs: Any) -> None:
    for messages in CONVERSATIONS:
        for gen in (True, False):
            want = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert ours.apply_chat_template(messages, add_generation_prompt=gen) == want
    text = ours.apply_chat_template(CONVERSATIONS[0])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")


def test_hf_folder_matches_gguf(ours: Tokenizer, theirs: Any, tmp_path: Path) -> None:
    theirs.save_pretrained(tmp_path)
    folder = Tokenizer.from_path(tmp_path)
    for text in TEXTS:
        ids = ours.encode(text)
        assert folder.encode(text) == ids and folder.decode(ids) == ours.decode(ids)
    for messages in CONVERSATIONS:
        assert folder.apply_chat_template(messages) == ours.apply_chat_template(messages)
    assert folder.eos_token_ids == ours.eos_token_ids and folder.bos_token_id == ours.bos_token_id
    assert folder.special_token_ids == ours.special_token_ids
    assert folder.token_bytes_table() == ours.token_bytes_table()
