"""The writer of one streaming response: output goes out as soon as it exists, one send per pass.

Two paths share one `Emitter` (its coalescing state and usage counts):
- the direct path: while the socket is free, the dispatcher's `deliver` calls the stream's
  flusher, which formats what is pending and hands it to the transport at once — no wake-up, no
  task switch per token. This is the common case and the cheap one (issue 4's profile: the
  per-event future, task step and aiohttp write layers were a third of the loop's time at 256
  streams).
- the pump (`pump_sse`): the request's coroutine. It writes the head, then parks until the
  direct path cannot go on: the socket is busy (a slow reader), the request ended or failed. While
  `write` awaits a busy socket, the dispatcher keeps appending to the stream; the next round takes
  all of it at once and `coalesce` merges it (up to `stream.max_tokens_per_event` tokens per SSE
  event), so a slow reader costs a few larger events, never extra work per token. The end of a
  request (its last tokens, the usage chunk, [DONE]) always goes through the pump, in one call of
  `end` when given (the server's: aiohttp's `write_eof`, which sends them with the chunked body's
  terminator in one send; the null engine's 256 streams ending in one step paid a second send
  each: the streamed run's tail was 38.5 ms against 21.0 non-streamed, bench/RESULTS.md).
With `stream.max_delay_ms` > 0 there is no direct path: the pump's gathering wait decides when.
What the bytes look like is the API's business: an `EventFormat` (event_format.py) per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from rillet.core.config import StreamConfig
from rillet.core.outputs import SeqDelta
from rillet.http.openai.chunks import Usage
from rillet.http.openai.errors import ApiError, finish_failure
from rillet.http.stream.coalesce import coalesce
from rillet.http.stream.event_format import EventFormat
from rillet.http.stream.request_stream import RequestStream

Write = Callable[[bytes], Awaitable[None]]


class DirectWrite(Protocol):
    """A synchronous write that never blocks: only called when `ready()` said the socket is free
    (transport_write.py). `__call__` frames its bytes; `raw` writes bytes `frame` made."""

    def ready(self) -> bool: ...

    def __call__(self, data: bytes) -> None: ...

    def frame(self, head: bytes, body: bytes, tail: bytes) -> bytes: ...

    def raw(self, data: bytes) -> None: ...


class Emitter:
    """SSE bytes from a stream's deltas; the first-token rule and usage carry across calls."""

    __slots__ = ("fmt", "limit", "started", "usage")

    def __init__(self, fmt: EventFormat, usage: Usage, num_choices: int, limit: int) -> None:
        self.fmt = fmt
        self.usage = usage
        self.limit = limit
        self.started = [False] * num_choices

    def events(self, deltas: list[SeqDelta], failure: ApiError | None) -> tuple[list[bytes], ApiError | None]:
        """Content and finish events, in order; stops at the first failure (returned)."""
        usage, fmt = self.usage, self.fmt
        for d in deltas:
            usage.update(d.index, d.completion_tokens, d.cached_tokens)
        out: list[bytes] = []
        for piece in coalesce(deltas, self.limit, self.started):
            if failure is not None:
                break
            # A failing delta's piece may hold tokens coalesced ahead of it (a slow reader's pile):
            # they were generated before the failure, so they go out before its error event.
            failure = finish_failure(piece.finish, piece.error, piece.error_kind)
            event = fmt.piece(piece.index, piece.text, piece.logprobs)
            if event:
                out.append(event)
            if failure is None and piece.finish is not None:
                out.append(fmt.finish(piece.index, piece.finish.value, piece.stop_str))
        return out, failure

    def single(self, d: SeqDelta, direct: DirectWrite) -> bytes | None:
        """The fast path's event: one delta that neither ends its choice nor carries logprobs; the
        same bytes `events` would give, framed for `direct` in one allocation (b"": an empty text,
        a held-back stop-string prefix, is no event). None: the format has no fast path for it
        (tools), and nothing was done."""
        parts = self.fmt.text_parts(d.index, d.text)
        if parts is None:
            return None
        self.usage.update(d.index, d.completion_tokens, d.cached_tokens)
        self.started[d.index] = True  # a piece of its own either way
        return direct.frame(*parts) if d.text else b""


def flusher(stream: RequestStream, emitter: Emitter, direct: DirectWrite) -> Callable[[], bool]:
    """The stream's direct path; False hands the work to the pump. Its bytes go straight to the
    socket, or to the stream's outbox, which the dispatcher writes once it has released the
    engine (stream.write_order after_release: dispatcher.py's `write_last`)."""

    def flush() -> bool:
        if stream.failure is not None or stream.unfinished == 0 or not direct.ready():
            return False
        pending = stream.pending
        if len(pending) == 1:  # the common case: one token since the last pass
            d = pending[0]
            if d.finish_reason is None and d.logprobs is None:
                data = emitter.single(d, direct)
                if data is not None:
                    stream.take()
                    if data:
                        stream.post(direct.raw, data)
                    return True
        out, _ = emitter.events(stream.take(), None)  # no failure: those end the request (above)
        if out:
            stream.post(direct, out[0] if len(out) == 1 else b"".join(out))
        return True

    return flush


async def pump_sse(
    stream: RequestStream,
    fmt: EventFormat,
    usage: Usage,
    write: Write,
    cfg: StreamConfig,
    head: bytes,
    direct: DirectWrite | None = None,
    end: Write | None = None,
) -> bool:
    """Writes `head`, every event of the request, then the format's end (OpenAI: the usage chunk if
    asked, and [DONE]) through `end` (default `write`): the response's last write.

    Returns False if the request failed (an SSE error event was sent instead of the rest).
    """
    emitter = Emitter(fmt, usage, stream.num_choices, cfg.max_tokens_per_event)
    delay = cfg.max_delay_ms / 1000.0
    if head:
        await write(head)
    try:
        if direct is not None and not delay:
            stream.flusher = flusher(stream, emitter, direct)
        return await _pump(stream, emitter, write, end or write, delay)
    finally:
        stream.flusher = None


async def _pump(stream: RequestStream, emitter: Emitter, write: Write, end: Write, delay: float) -> bool:
    limit = emitter.limit
    while True:
        await stream.wait()
        # Optional gathering wait: never before a choice's first token, never past a full event.
        if delay and all(emitter.started) and stream.unfinished and stream.pending_tokens < limit:
            await asyncio.sleep(delay)
        out, failure = emitter.events(stream.take(), stream.failure)
        if failure is not None:
            out.append(emitter.fmt.error(failure))
            await write(b"".join(out))
            return False
        if stream.finished:
            out.append(emitter.fmt.end(emitter.usage))
            await end(b"".join(out))
            return True
        if out:
            await write(b"".join(out))
