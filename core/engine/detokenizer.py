"""Per-sequence incremental detokenizer: each token decoded once, stop conditions, finish reasons.

Text flows token bytes -> incremental UTF-8 decoder (holds the bytes of an unfinished character;
invalid bytes become U+FFFD as `bytes.decode(errors="replace")` would) -> stop-string check (holds any
suffix that could still begin a stop string) -> released text.

Stopping and min_tokens: the sampler bans EOS / stop_token_ids while fewer than min_tokens outputs
exist, so the n-th output token (n counts it) stops on EOS or a stop id only when n > min_tokens; a stop
string completed by the n-th token stops when n >= min_tokens (at least min_tokens tokens of content).
EOS text is never emitted; a stop token's text (and a stop string) is emitted only with
include_stop_str_in_output.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from rillet.core.engine.stop_checker import StopStrings
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason


def token_text_table(token_bytes: list[bytes], special_ids: frozenset[int]) -> list[str | None]:
    """Each token's text when its bytes are complete, valid UTF-8 on their own (else None), and ""
    for special tokens: after a token that left no bytes pending, the next one decodes to this."""
    table: list[str | None] = []
    for i, b in enumerate(token_bytes):
        if i in special_ids:
            table.append("")
            continue
        try:
            table.append(b.decode("utf-8"))
        except UnicodeDecodeError:
            table.append(None)
    return table


class IncrementalDetokenizer:
    def __init__(
        self,
        token_bytes: list[bytes],
        special_ids: frozenset[int],
        params: SamplingParams,
        eos_token_ids: tuple[int, ...],
        token_text: list[str | None] | None = None,  # token_text_table(token_bytes, special_ids)
    ) -> None:
        self._token_bytes = token_bytes  # shared table, never copied
        self._token_text = token_text  # shared too; None = decode every token's bytes
        self._special_ids = special_ids
        self._params = params
        self._eos_ids = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
        self._stop_ids = frozenset(params.stop_token_ids)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopStrings(params.stop) if params.stop else None
        self._parts: list[str] = []
        self._num_added = 0
        self.finish_reason: FinishReason | None = None
        self.stop_str: str | None = None  # the stop string that finished the sequence, if one did

    @property
    def text(self) -> str:
        """Everything released so far."""
        return "".join(self._parts)

    def add(self, token_id: int, num_output_tokens: int) -> tuple[str, FinishReason | None]:
        """Feeds the newest output token; `num_output_tokens` counts it. Returns (new text, finish).

        On a finish the returned text already includes whatever was held back.
        """
        if self.finish_reason is not None:
            raise RuntimeError("add() after the sequence finished")
        self._num_added += 1
        n, p = num_output_tokens, self._params
        if n > p.min_tokens and token_id in self._eos_ids:
            return self._finish(self._drain(""), FinishReason.STOP)
        if n > p.min_tokens and token_id in self._stop_ids:
            text = self._decode(token_id) if p.include_stop_str_in_output else ""
            return self._finish(self._drain(text), FinishReason.STOP)
        text, stop = self._release(self._decode(token_id), armed=n >= p.min_tokens)
        if stop is not None:
            self.stop_str = stop
            return self._finish(text + stop if p.include_stop_str_in_output else text, FinishReason.STOP)
        if n >= p.max_tokens:
            return self._finish(text + self._drain(""), FinishReason.LENGTH)
        self._parts.append(text)
        return text, None

    def add_many(self, token_ids: Iterable[int]) -> tuple[str, FinishReason | None]:
        """Feeds tokens until one finishes the sequence (the rest are ignored); for tests and replays."""
        out: list[str] = []
        for token_id in token_ids:
            text, finish = self.add(token_id, self._num_added + 1)
            out.append(text)
            if finish is not None:
                return "".join(out), finish
        return "".join(out), None

    def flush(self) -> str:
        """Releases held text and unfinished bytes (as U+FFFD), for finishes decided elsewhere
        (context limit, abort). add() flushes by itself when it finishes the sequence."""
        text = self._drain("")
        self._parts.append(text)
        return text

    def _drain(self, text: str) -> str:
        """Held text, then `text` (decoded after it), then any unfinished bytes as U+FFFD."""
        held = self._stops.flush() if self._stops is not None else ""
        return held + text + self._utf8.decode(b"", final=True)

    def _decode(self, token_id: int) -> str:
        # ids past the table (padded model vocabulary) and special tokens contribute no text
        if not 0 <= token_id < len(self._token_bytes):
            return ""
        if self._token_text is not None and not self._utf8.buffer:  # no bytes of a character pending
            text = self._token_text[token_id]
            if text is not None:
                return text
        if token_id in self._special_ids:
            return ""
        return self._utf8.decode(self._token_bytes[token_id])

    def _release(self, text: str, armed: bool) -> tuple[str, str | None]:
        if self._stops is None:
            return text, None
        return self._stops.feed(text, armed)

    def _finish(self, text: str, reason: FinishReason) -> tuple[str, FinishReason]:
        self.finish_reason = reason
        self._parts.append(text)
        return text, reason
