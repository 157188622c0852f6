"""Writing SSE bytes straight to a prepared response's transport, bypassing aiohttp's writer.

Used only by the direct path of sse.py, and only while the transport's own buffer is empty (the
kernel took everything so far): then `transport.write` sends at once and never queues, so no
back-pressure is skipped. HTTP/1.1 responses without a length are chunked by aiohttp; the same
framing is applied here (`<hex length>\\r\\n<data>\\r\\n`), so aiohttp's final `write_eof` still
closes a valid body. A compressed response never gets a direct path.
"""

from __future__ import annotations

import asyncio

from aiohttp.abc import AbstractStreamWriter


class TransportWrite:
    __slots__ = ("_chunked", "_transport")

    def __init__(self, transport: asyncio.Transport, chunked: bool) -> None:
        self._transport = transport
        self._chunked = chunked

    def ready(self) -> bool:
        t = self._transport
        return not t.is_closing() and t.get_write_buffer_size() == 0

    def __call__(self, data: bytes) -> None:
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        self._transport.write(data)

    def frame(self, head: bytes, body: bytes, tail: bytes) -> bytes:
        """`head + body + tail` as this response's body bytes (framed when chunked), made in one
        allocation: the fast path's event is never copied again on its way to the socket."""
        if self._chunked:
            return b"%x\r\n%b%b%b\r\n" % (len(head) + len(body) + len(tail), head, body, tail)
        return head + body + tail

    def raw(self, data: bytes) -> None:
        """Bytes that `frame` made: written as they are."""
        self._transport.write(data)


def transport_write(writer: AbstractStreamWriter | None) -> TransportWrite | None:
    """For a prepared, uncompressed StreamResponse's writer; None if it cannot be bypassed."""
    transport = getattr(writer, "transport", None)
    chunked = getattr(writer, "chunked", None)
    if not isinstance(transport, asyncio.Transport) or not isinstance(chunked, bool):
        return None
    if getattr(writer, "_compress", None) is not None:
        return None
    return TransportWrite(transport, chunked)
