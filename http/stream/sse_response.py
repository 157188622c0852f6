"""A streamed response whose status line and headers leave in the same send as its first event.

aiohttp's `web.StreamResponse` sends its headers alone at `prepare()`; a streamed request then paid
two sends (and its client two wake-ups) before its first token: the headers, then the head event
(OpenAI chat's role chunk, Responses' `created`, Anthropic's `message_start`). `web.Response`
keeps its headers buffered until the body's first bytes (aiohttp >= 3.11: `_send_headers_immediately`,
the switch aiohttp's own classes set); `SseResponse` does the same, so the head's write carries them.
A format with no head (completions without `echo`) flushes the headers at once, so a client sees
its response begin as before, and the direct path (transport_write.py), which writes past aiohttp's
writer, never finds them still held. Older aiohttp sends them at `prepare()` anyway.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter


class SseResponse(web.StreamResponse):
    _send_headers_immediately = False


async def start_sse(resp: SseResponse, request: web.Request, head: bytes) -> AbstractStreamWriter | None:
    """Prepares `resp`: its headers go out with `head` (the caller's first write) or now if empty."""
    writer = await resp.prepare(request)
    send_headers = getattr(writer, "send_headers", None)
    if not head and send_headers is not None:
        send_headers()
    return writer
