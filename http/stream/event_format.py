"""What the SSE writer (sse.py) asks of an API's stream format: bytes for each step of a stream.

One writer serves every API: OpenAI chat and completions chunks (openai/chunks.py), Responses
semantic events (responses/events.py), Anthropic Messages events (anthropic/events.py). A format is
per request and may keep state (sequence numbers, open output items, a tool-call parser); its
methods are called in stream order, on the event loop, and return the bytes to send (b"" for none).
"""

from __future__ import annotations

from typing import Protocol

from rillet.core.sequence import TokenLogprob
from rillet.http.openai.chunks import Usage
from rillet.http.openai.errors import ApiError


class EventFormat(Protocol):
    def head(self) -> bytes:
        """Sent once, before any output (OpenAI chat: the role chunks; Responses: created)."""
        ...

    def piece(self, index: int, text: str, logprobs: list[TokenLogprob] | None) -> bytes:
        """A coalesced piece of one choice's output (text may be empty, logprobs None)."""
        ...

    def text_parts(self, index: int, text: str) -> tuple[bytes, bytes, bytes] | None:
        """The fast path (sse.py): `piece(index, text, None)`'s bytes as (head, middle, tail), for
        the writer to join once with its framing; None when this format has no fast path for it
        (then `piece` is called), and then the format's state must not have changed. Parts for a
        non-empty text are always sent: a format may take the piece as `piece` would (Responses
        counts its sequence numbers); for an empty text nothing is sent and nothing may change."""
        ...

    def finish(self, index: int, reason: str, stop_str: str | None) -> bytes:
        """Choice `index` ended ("stop" or "length"; `stop_str`: the stop string that ended it)."""
        ...

    def end(self, usage: Usage) -> bytes:
        """Every choice has ended: the closing events (usage, [DONE], completed, message_stop)."""
        ...

    def error(self, err: ApiError) -> bytes:
        """The request failed mid-stream: its error event(s), which end the stream."""
        ...
