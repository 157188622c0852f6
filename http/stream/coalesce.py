"""Merging the deltas a consumer took at once into SSE-sized pieces.

Rules (issue 3): within a choice, order is kept and nothing is dropped; a piece holds at most
`limit` tokens, unless a single engine delta alone is larger (its text cannot be split per token);
the first delta of every choice is a piece of its own, so the first token is never held back to
wait for company. Different choices never share a piece (one SSE chunk = one choice).
"""

from __future__ import annotations

from dataclasses import dataclass

from rillet.core.errors import ErrorKind
from rillet.core.outputs import SeqDelta
from rillet.core.sequence import FinishReason, TokenLogprob


@dataclass(slots=True)
class Piece:
    index: int  # choice index
    texts: list[str]
    num_tokens: int
    logprobs: list[TokenLogprob] | None
    finish: FinishReason | None = None
    error: str | None = None
    error_kind: ErrorKind | None = None
    stop_str: str | None = None

    @property
    def text(self) -> str:
        return self.texts[0] if len(self.texts) == 1 else "".join(self.texts)


def _new(d: SeqDelta) -> Piece:
    lps = list(d.logprobs) if d.logprobs is not None else None
    return Piece(d.index, [d.text], len(d.token_ids), lps)


def coalesce(deltas: list[SeqDelta], limit: int, started: list[bool]) -> list[Piece]:
    """`started[i]` is True once choice i had its first piece (updated in place)."""
    out: list[Piece] = []
    open_: dict[int, Piece] = {}  # choice -> the piece still accepting tokens
    for d in deltas:
        i = d.index
        piece = open_.get(i)
        k = len(d.token_ids)
        if not started[i]:
            started[i] = True
            piece = _new(d)
            out.append(piece)
            open_.pop(i, None)  # the first piece stays alone
        elif piece is not None and piece.num_tokens + k <= limit:
            piece.texts.append(d.text)
            piece.num_tokens += k
            if d.logprobs is not None:
                if piece.logprobs is None:
                    piece.logprobs = []
                piece.logprobs.extend(d.logprobs)
        else:
            piece = _new(d)
            out.append(piece)
            open_[i] = piece
        if d.finish_reason is not None:
            piece.finish = d.finish_reason
            piece.error = d.error
            piece.error_kind = d.error_kind
            piece.stop_str = d.stop_str
            open_.pop(i, None)
    return out
