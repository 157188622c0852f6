"""Keep-alive events on an idle stream (Anthropic Messages' `ping`): a timer on the event loop, no task.

While a request waits for admission or prefills a long prompt, its stream carries nothing; clients
and proxies with read timeouts may take it for dead. Every `interval` seconds without output (a
token or an earlier ping) the timer writes the front end's ping straight to the socket, and only
when that is safe: the socket's buffer is empty (sse.py's direct path would write there too) and no
output is waiting for the writer. The end of a stream is the writer's alone: the timer stops first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rillet.http.stream.request_stream import RequestStream
from rillet.http.stream.sse import DirectWrite


@contextmanager
def keep_alive(
    stream: RequestStream, direct: DirectWrite | None, ping: bytes | None, interval: float
) -> Iterator[None]:
    if ping is None or direct is None or interval <= 0:
        yield
        return
    loop = asyncio.get_running_loop()
    last_ping = time.monotonic()
    handle: asyncio.TimerHandle | None = None

    def tick() -> None:
        nonlocal handle, last_ping
        if stream.unfinished == 0 or stream.failure is not None:
            handle = None
            return
        now = time.monotonic()
        quiet_since = max(last_ping, stream.last_token_at)
        if now - quiet_since >= interval and not stream.pending and direct.ready():
            direct(ping)
            last_ping = quiet_since = now
        handle = loop.call_later(max(quiet_since + interval - now, interval / 10), tick)

    handle = loop.call_later(interval, tick)
    try:
        yield
    finally:
        if handle is not None:
            handle.cancel()
