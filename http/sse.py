"""The writer of one streaming response: wait for output, take all of it, write it as one send.

While `write` awaits a busy socket, the dispatcher keeps appending to the request's stream; the
next round takes all of that at once and `coalesce` merges it (up to `stream.max_tokens_per_event`
tokens per SSE event), so a slow reader costs a few larger events, never extra work per token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from rillet.core.config import StreamConfig

from .chunks import DONE, ChunkFormat, Usage, error_event
from .coalesce import coalesce
from .errors import finish_failure
from .stream_state import RequestStream

Write = Callable[[bytes], Awaitable[None]]


async def pump_sse(
    stream: RequestStream, fmt: ChunkFormat, usage: Usage, write: Write, cfg: StreamConfig, head: bytes
) -> bool:
    """Writes `head`, every event of the request, the usage chunk (if asked) and [DONE].

    Returns False if the request failed (an SSE error event was sent instead of the rest).
    """
    started = [False] * stream.num_choices
    limit = cfg.max_tokens_per_event
    delay = cfg.max_delay_ms / 1000.0
    if head:
        await write(head)
    while True:
        await stream.wait()
        # Optional gathering wait: never before a choice's first token, never past a full event.
        if delay and all(started) and stream.unfinished and stream.pending_tokens < limit:
            await asyncio.sleep(delay)
        deltas = stream.take()
        for d in deltas:
            usage.update(d.index, d.completion_tokens, d.cached_tokens)
        out: list[bytes] = []
        failure = stream.failure
        for piece in coalesce(deltas, limit, started):
            failure = failure or finish_failure(piece.finish, piece.error)
            if failure is not None:
                break
            if piece.logprobs or piece.text:  # an empty text (held-back stop prefix) is no event
                out.append(fmt.content(piece))
            if piece.finish is not None:
                out.append(fmt.finish(piece.index, piece.finish.value))
        if failure is not None:
            out += (error_event(failure), DONE)
            await write(b"".join(out))
            return False
        if stream.finished:
            if fmt.include_usage:
                out.append(fmt.usage(usage.body()))
            out.append(DONE)
            await write(b"".join(out))
            return True
        if out:
            await write(b"".join(out))
