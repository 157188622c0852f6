"""The bytes each token adds: concatenated they are the decoded text, every token of the default
model's vocabulary has its own (special tokens none); a tiny sentencepiece-style GGUF written here
(tokenizer model `llama`: byte fallback, `▁`, merges recovered from scores) against transformers;
and encode/decode from two threads at once."""

from __future__ import annotations

import threading
from pathlib import Path

import gguf
from core_helpers.tokenizer_texts import TEXTS
from rillet.core.tokenizer.tokenizer import Tokenizer


def _joined(tok: Tokenizer, ids: list[int]) -> str:
    return b"".join(tok.token_bytes(i) or b"" for i in ids).decode("utf-8", errors="replace")


def test_token_bytes_concatenate_to_decode(ours: Tokenizer) -> None:
    for text in TEXTS:
        ids = ours.encode(text)
        assert _joined(ours, ids) == ours.decode(ids), text


def test_token_bytes_of_every_token(ours: Tokenizer) -> None:
    table = ours.token_bytes_table()
    assert len(table) == ours.vocab_size == 49152
    assert ours.token_bytes_table() is table  # built once
    for i in range(ours.vocab_size):
        raw = ours.token_bytes(i)
        if i in ours.special_token_ids:
            assert raw is None and table[i] == b"" and ours.decode([i]) == ""
            assert ours.decode([i], skip_special_tokens=False) == ours.id_to_token(i)
        else:
            assert raw is not None and raw == table[i]
            assert raw.decode("utf-8", errors="replace") == ours.decode([i]), i
    assert ours.token_bytes(-1) is None and ours.token_bytes(ours.vocab_size) is None
    assert ours.id_to_token(ours.vocab_size + 5) == ""


def test_encode_and_decode_from_two_threads(ours: Tokenizer) -> None:
    expected = {t: ours.encode(t) for t in TEXTS}
    texts = {t: ours.decode(ids) for t, ids in expected.items()}
    failures: list[str] = []

    def encoder() -> None:
        for _ in range(20):
            failures.extend(t for t in TEXTS if ours.encode(t) != expected[t])

    def decoder() -> None:
        for _ in range(20):
            failures.extend(t for t in TEXTS if ours.decode(expected[t]) != texts[t])

    threads = [threading.Thread(target=encoder), threading.Thread(target=decoder)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def _write_sentencepiece_gguf(path: Path) -> None:
    pieces = {"▁": -1.0} | dict.fromkeys("abcdefghijklmnopqrstuvwxyzHW,.!", -2.0)
    merged = ["▁t", "he", "▁the", "▁a", "in", "▁in", "ing", "er", "▁w", "or", "▁wor", "ld", "▁world"]
    merged += ["▁h", "ll", "▁he", "▁hell", "▁hello", "▁H", "▁He", "▁Hell", "▁Hello", "▁▁", "▁▁▁▁"]
    pieces |= {p: -3.0 - 0.1 * i for i, p in enumerate(merged)}
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + list(pieces.values()))
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces))  # unknown, control, byte, normal
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_sentencepiece_gguf_matches_transformers(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    path = tmp_path / "sp.gguf"
    _write_sentencepiece_gguf(path)
    ours = Tokenizer.from_gguf(path)
    theirs = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    texts = ["Hello world", " Hello  world", "the thing in water", "héllo wörld 😀", "", "  ", "a\nb", "Hi!"]
    for text in texts:
        ids = ours.encode(text)
        assert ids == theirs.encode(text), text
        assert ids[0] == 1  # llama-style vocabularies add BOS
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
        # Leading-space rule: decode() drops the space of the first `▁`; the bytes keep it.
        joined = _joined(ours, ids)
        assert joined == ours.decode(ids) or joined == " " + ours.decode(ids), text
    assert ours.token_bytes(3 + 0xF0) == b"\xf0"  # byte-fallback piece <0xF0>
    assert ours.token_bytes(ours.encode("Hello", add_special_tokens=False)[0]) == b" Hello"
