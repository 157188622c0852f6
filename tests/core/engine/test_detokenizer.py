"""Incremental detokenizer: UTF-8 across tokens, stop strings across tokens, finish reasons.

The token-bytes table is built here from the default model's tokenizer (transformers, GGUF) by
inverting GPT-2's byte-to-unicode map, independently of rillet's own tokenizer module.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from harness.hf_gguf import hf_default_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st
from rillet.core.engine.detokenizer import IncrementalDetokenizer, token_text_table
from rillet.core.engine.stop_checker import StopStrings
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason

EOS = 2  # <|im_end|>
TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "emoji: 😀🎉👍🏽 and a family 👩‍👩‍👧 and flags 🇯🇵🇫🇷",
    "CJK: 世界你好，日本語のテキスト、한국어 문장",
    "combining: e\u0301 a\u0308 n\u0303 Z\u0351\u0310\u0352 and precomposed é ä ñ",
    "math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑∫√∞ and ligature ﬁ ﬂ",
    "mixed\ttabs\nnewlines\r\n  spaces   and ``` code ``` «quotes» — dashes…",
    "Ελληνικά, русский, עברית, العربية, हिन्दी",
]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for every byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


class Vocab:
    def __init__(self) -> None:
        self.tok = hf_default_tokenizer()
        self.special = frozenset(self.tok.added_tokens_decoder) | frozenset(self.tok.all_special_ids)
        decode_byte = {c: b for b, c in bytes_to_unicode().items()}
        self.table = [b""] * len(self.tok)
        for token, i in self.tok.get_vocab().items():
            if i not in self.special:
                self.table[i] = bytes(decode_byte[c] for c in token)
        self.byte_token = {t[0]: i for i, t in enumerate(self.table) if len(t) == 1}
        self.text = token_text_table(self.table, self.special)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))

    def detok(self, fast: bool = True, **params: Any) -> IncrementalDetokenizer:
        """`fast`: with the whole-token text table (what the engine uses); else bytes only."""
        params.setdefault("max_tokens", 10_000)
        text = self.text if fast else None
        return IncrementalDetokenizer(self.table, self.special, SamplingParams(**params), (EOS,), text)


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab()


def stream(detok: IncrementalDetokenizer, ids: list[int]) -> tuple[list[str], FinishReason | None]:
    deltas = []
    for n, token_id in enumerate(ids, start=1):
        text, finish = detok.add(token_id, n)
        deltas.append(text)
        if finish is not None:
            return deltas, finish
    return deltas, None


def test_table_has_single_byte_tokens(vocab: Vocab) -> None:
    # every byte that can occur in UTF-8 text, bar a few control characters, has its own token
    assert set(range(0x20, 0xC0)) | set(range(0xC2, 0xF1)) | {0xF3, 0xF4} <= set(vocab.byte_token)
    assert vocab.table[EOS] == b""


@pytest.mark.parametrize("text", TEXTS)
def test_streaming_equals_full_decode(vocab: Vocab, text: str) -> None:
    ids = vocab.encode(text)
    detok = vocab.detok()
    deltas, finish = stream(detok, ids)
    assert finish is None
    assert "".join(deltas) == detok.text == vocab.decode(ids) == text
    assert "\ufffd" not in detok.text  # a split character is held, never emitted half-done


@pytest.mark.parametrize("text", TEXTS[1:5])
def test_every_truncation_flushes_like_full_decode(vocab: Vocab, text: str) -> None:
    ids = vocab.encode(text)
    for k in range(1, len(ids) + 1):
        detok = vocab.detok(max_tokens=k)
        deltas, finish = stream(detok, ids[:k])
        assert finish is FinishReason.LENGTH
        assert "".join(deltas) == vocab.decode(ids[:k])


def test_random_token_soup_matches_hf_decode(vocab: Vocab) -> None:
    rng = random.Random(0)
    for _ in range(30):
        ids = [rng.randrange(17, len(vocab.table)) for _ in range(rng.randrange(1, 40))]
        detok = vocab.detok()
        text = "".join(stream(detok, ids)[0]) + detok.flush()
        assert text == detok.text == vocab.decode(ids)


def test_whole_token_text_table_changes_nothing(vocab: Vocab) -> None:
    """Tokens that are pieces of one character (byte tokens) mixed with whole ones and specials."""
    rng = random.Random(1)
    pieces = list(vocab.byte_token.values())
    for _ in range(60):
        ids = [
            rng.choice(pieces) if rng.random() < 0.4 else rng.randrange(0, len(vocab.table))
            for _ in range(rng.randrange(1, 40))
        ]
        fast, slow = vocab.detok(), vocab.detok(fast=False)
        assert stream(fast, ids) == stream(slow, ids)
        assert fast.flush() == slow.flush() and fast.text == slow.text


@pytest.mark.parametrize(
    "raw",
    [
        b"a\x80b",  # lone continuation byte
        b"\xc3a",  # lead byte cut short by ASCII
        b"\xe2\x82x",
        b"\xf0\x9f\x98",  # unfinished at the end of the stream
        b"\xed\xa0\x80",  # surrogate
        b"\xe0\x80\xaf",  # overlong
        b"\xf4\x90\x80\x80",  # past U+10FFFF
        b"\xf0\x9f\x98\x80\xc3",
        b"\xe4\xb8\xe4\xb8\x96",  # broken character followed by a whole one
    ],
)
def test_invalid_utf8_becomes_replacement_chars(vocab: Vocab, raw: bytes) -> None:
    ids = [vocab.byte_token[b] for b in raw]
    detok = vocab.detok()
    text = "".join(stream(detok, ids)[0]) + detok.flush()
    assert text == raw.decode(errors="replace") == vocab.decode(ids)


def test_special_tokens_contribute_nothing(vocab: Vocab) -> None:
    ids = vocab.encode("a😀b")
    detok = vocab.detok()
    with_specials = [ids[0], 1, *ids[1:3], 5, *ids[3:]]
    assert "".join(stream(detok, with_specials)[0]) == "a😀b"


def test_stop_string_spanning_tokens(vocab: Vocab) -> None:
    text = "The answer is forty-two. Then more text follows here."
    ids = vocab.encode(text)
    for stop, include in [("forty-two", False), ("y-tw", False), ("two. Then", True), ("xyz", False)]:
        detok = vocab.detok(stop=(stop,), include_stop_str_in_output=include)
        deltas, finish = stream(detok, ids)
        expected = text if stop not in text else text[: text.index(stop) + (len(stop) if include else 0)]
        assert "".join(deltas) + ("" if finish else detok.flush()) == expected
        assert finish is (FinishReason.STOP if stop in text else None)


def test_stop_string_that_is_a_prefix_of_another(vocab: Vocab) -> None:
    ids = vocab.encode("say hello world")
    deltas, finish = stream(vocab.detok(stop=("hello world", "hello")), ids)
    assert ("".join(deltas), finish) == ("say ", FinishReason.STOP)
    # both complete with the token " world": the earliest start wins, as truncating the whole text would
    deltas, finish = stream(vocab.detok(stop=("lo w", "hello world")), ids)
    assert ("".join(deltas), finish) == ("say ", FinishReason.STOP)
    deltas, finish = stream(vocab.detok(stop=("o w", "lo")), ids)
    assert ("".join(deltas), finish) == ("say hel", FinishReason.STOP)


def test_held_back_text_is_released_when_the_prefix_breaks(vocab: Vocab) -> None:
    detok = vocab.detok(stop=("abc",))
    a, b, d = (vocab.encode(s)[0] for s in ("a", "b", "d"))
    deltas = [detok.add(t, n)[0] for n, t in enumerate([a, b, a, b, d, a], start=1)]
    assert deltas == ["", "", "ab", "", "abd", ""]
    assert detok.flush() == "a"
    assert detok.text == "ababda"


def test_eos_stop_ids_and_max_tokens(vocab: Vocab) -> None:
    ids = vocab.encode("one two three four")
    deltas, finish = stream(vocab.detok(), [*ids[:2], EOS, *ids[2:]])
    assert ("".join(deltas), finish) == (vocab.decode(ids[:2]), FinishReason.STOP)
    deltas, finish = stream(vocab.detok(ignore_eos=True), [*ids[:2], EOS, *ids[2:]])
    assert ("".join(deltas), finish) == ("one two three four", None)
    deltas, finish = stream(vocab.detok(stop_token_ids=(ids[2],)), ids)
    assert ("".join(deltas), finish) == (vocab.decode(ids[:2]), FinishReason.STOP)
    deltas, finish = stream(vocab.detok(stop_token_ids=(ids[2],), include_stop_str_in_output=True), ids)
    assert ("".join(deltas), finish) == (vocab.decode(ids[:3]), FinishReason.STOP)
    deltas, finish = stream(vocab.detok(max_tokens=3), ids)
    assert ("".join(deltas), finish) == (vocab.decode(ids[:3]), FinishReason.LENGTH)
    deltas, finish = stream(vocab.detok(max_tokens=3, stop=("three",)), ids)  # both on token 3: STOP
    assert ("".join(deltas), finish) == ("one two ", FinishReason.STOP)


def test_max_tokens_flushes_held_stop_prefix(vocab: Vocab) -> None:
    ids = vocab.encode("one two")
    deltas, finish = stream(vocab.detok(max_tokens=len(ids), stop=(" two three",)), ids)
    assert (deltas[-1], finish) == (" two", FinishReason.LENGTH)


def test_min_tokens_defers_every_stop(vocab: Vocab) -> None:
    ids = vocab.encode("a b c d e")  # one token per word
    assert len(ids) == 5
    deltas, finish = stream(vocab.detok(min_tokens=2), [ids[0], EOS, ids[1], EOS])
    assert ("".join(deltas), finish) == ("a b", FinishReason.STOP)  # EOS as token 2 of min 2: ignored
    deltas, finish = stream(vocab.detok(min_tokens=3, stop_token_ids=(ids[1],)), [*ids[:3], ids[1]])
    assert ("".join(deltas), finish) == ("a b c", FinishReason.STOP)
    detok = vocab.detok(min_tokens=3, stop=(" b", "e f"))  # " b" completes at token 2
    deltas, finish = stream(detok, ids)
    assert (deltas[1], finish) == (" b", None)
    assert ("".join(deltas), detok.flush()) == ("a b c d ", "e")
    deltas, finish = stream(vocab.detok(min_tokens=3, stop=(" c",)), ids)  # completes at token 3
    assert ("".join(deltas), finish) == ("a b", FinishReason.STOP)


def test_add_after_finish_is_an_error(vocab: Vocab) -> None:
    detok = vocab.detok()
    assert detok.add(EOS, 1) == ("", FinishReason.STOP)
    with pytest.raises(RuntimeError):
        detok.add(EOS, 2)


def test_add_many_counts_tokens_itself(vocab: Vocab) -> None:
    ids = vocab.encode("one two three")
    detok = vocab.detok(max_tokens=2)
    assert detok.add_many(ids) == (vocab.decode(ids[:2]), FinishReason.LENGTH)


def test_emoji_split_over_four_single_byte_tokens() -> None:
    table = [b"a", b"\xf0", b"\x9f", b"\x98", b"\x80", b"<special>"]
    params = SamplingParams(max_tokens=100, stop=("😀b",))
    detok = IncrementalDetokenizer(table, frozenset({5}), params, (5,))
    assert [detok.add(t, n)[0] for n, t in enumerate([0, 1, 2, 3, 4], start=1)] == ["a", "", "", "", ""]
    assert detok.add(0, 6) == ("😀a", None)
    detok = IncrementalDetokenizer(table, frozenset({5}), SamplingParams(max_tokens=100), (5,))
    assert detok.add_many([1, 2, 3]) == ("", None)
    assert detok.add(5, 4) == ("\ufffd", FinishReason.STOP)  # EOS ends the stream mid-character
    table[1] = b"\xff"  # a byte no UTF-8 text holds
    detok = IncrementalDetokenizer(table, frozenset({5}), SamplingParams(max_tokens=3), (5,))
    assert detok.add_many([1, 0, 1]) == ("\ufffda\ufffd", FinishReason.LENGTH)


def reference_cut(text: str, stops: list[str]) -> str | None:
    """One character per feed: at the first position where a stop ends, cut at the earliest start."""
    for end in range(1, len(text) + 1):
        starts = [end - len(s) for s in stops if end >= len(s) and text[end - len(s) : end] == s]
        if starts:
            return text[: min(starts)]
    return None


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abc", max_size=20),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 20), max_size=6),
)
def test_stop_strings_property(text: str, stops: list[str], cuts: list[int]) -> None:
    checker = StopStrings(tuple(stops))
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    out, hit = [], None
    for lo, hi in itertools.pairwise(bounds):
        released, hit = checker.feed(text[lo:hi])
        out.append(released)
        if hit is not None:
            break
    result = "".join(out) if hit is not None else "".join(out) + checker.flush()
    assert not any(s in result for s in stops)  # no stop string ever escapes
    assert (hit is None) == (reference_cut(text, stops) is None)
    if hit is None:
        assert result == text
    else:
        assert text.startswith(result + hit)
        if len(bounds) == len(text) + 1:  # one character per feed: exact streaming semantics
            assert result == reference_cut(text, stops)
