"""coalesce(): the first token of each choice alone, at most N tokens per event (a larger delta
stays whole), and interleaved choices each keep their own order and finish."""

from __future__ import annotations

from http_doubles.stream_deltas import delta
from rillet.core.sequence import FinishReason
from rillet.http.stream.coalesce import coalesce


def test_first_token_of_each_choice_is_alone() -> None:
    started = [False, False]
    pieces = coalesce([delta("a"), delta("b"), delta("c"), delta("x", 1), delta("y", 1)], 16, started)
    assert [(p.index, p.text) for p in pieces] == [(0, "a"), (0, "bc"), (1, "x"), (1, "y")]
    assert started == [True, True]
    # Later rounds: no first-token split any more.
    assert [p.text for p in coalesce([delta("d"), delta("e")], 16, started)] == ["de"]


def test_at_most_n_tokens_per_event_and_order_kept() -> None:
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN"  # 40 one-token deltas
    pieces = coalesce([delta(ch) for ch in letters], 16, [True])
    assert [p.num_tokens for p in pieces] == [16, 16, 8]
    assert "".join(p.text for p in pieces) == letters
    # One delta larger than the limit cannot be split per token: it stays one event.
    big = coalesce([delta("xy"), delta("0123456789", ntok=10), delta("z")], 4, [True])
    assert [p.text for p in big] == ["xy", "0123456789", "z"]


def test_interleaved_choices_keep_their_own_order_and_finish() -> None:
    ds = [
        delta("a", 0),
        delta("1", 1),
        delta("b", 0),
        delta("2", 1),
        delta("c", 0, FinishReason.STOP),
        delta("3", 1),
    ]
    pieces = coalesce(ds, 16, [True, True])
    assert [(p.index, p.text, p.finish) for p in pieces] == [
        (0, "abc", FinishReason.STOP),
        (1, "123", None),
    ]
