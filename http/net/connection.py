"""One client connection: aiohttp's `RequestHandler` plus read deadlines, the connection cap and
answers in the OpenAI error shape for what aiohttp's parser refuses.

aiohttp itself bounds none of the slow cases: a client that sends a header byte every few seconds,
or a body that never ends, holds its socket (and a file descriptor) for as long as it likes. Here
each connection is, at any time, in one phase with at most one timer:

    HEAD  reading a request's headers: from accept (first request) or from the first byte of a
          later request, `server.header_timeout_s` until the middleware sees the request
    BUSY  the request runs: no timer here. The body has its own deadline (`read_body`,
          `server.body_timeout_s`); generation has `server.request_timeout_s`
    IDLE  between requests: closed after `server.keepalive_timeout_s` without a byte

A missed deadline closes the connection (after a 408 when the client had started a request) and is
counted and logged by `ConnLimits`. Over the cap, aiohttp never sees the connection: it gets a 503
at once and a half-close, and is closed when the client closes it (or `REJECT_LIFETIME_S` later at
most), or it is reset.

aiohttp internals relied on (tests/reliability/test_slow_clients.py and test_wire_errors.py pin
them): `RequestHandler.handle_error` answers parser errors; `_parser.feed_data` raises a parser
error that, mid-body, aiohttp itself would queue behind the request reading that body (which then
waits forever): it is delivered to that body instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from rillet.http.net.conn_limits import Admission, ConnLimits
from rillet.http.net.responses import error_response
from rillet.http.net.wire_errors import raw_response, read_timeout, too_many_connections, wire_error
from rillet.http.openai.errors import ApiError

_HEAD, _BUSY, _IDLE, _CLOSED = range(4)
Shape = Callable[[ApiError], bytes]  # an error's body in a route's API's shape
# After a deadline closes a connection whose client does not read, the close waits for the 408 to
# drain; it is cut after this long.
_CLOSE_GRACE_S = 1.0


class ApiRequestHandler(RequestHandler):
    __slots__ = (
        "_admission",
        "_body",
        "_got_bytes",
        "_limits",
        "_max_header",
        "_peer",
        "_phase",
        "_refused",
        "_timer",
    )

    def __init__(self, manager: Any, *, limits: ConnLimits, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limits = limits
        self._admission = Admission.RESET  # until connection_made admits it
        self._phase = _HEAD
        self._timer: asyncio.TimerHandle | None = None
        self._got_bytes = False  # any byte of the request being read (HEAD)
        self._body: StreamReader | None = None  # the running request's body while it is read
        self._peer = "?"
        self._max_header = int(kwargs.get("max_field_size", 0))
        self._refused: Any = None  # the transport of a connection answered 503 (over the cap)
        self._parser = _BodyErrorRelay(self._parser, self)  # type: ignore[assignment]

    # ---- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        self._admission = self._limits.admit(self._peer)
        if self._admission is Admission.RESET:
            _reset(transport)  # aiohttp never sees this connection
            return
        if self._admission is Admission.REPLY_503:
            self._refuse(transport)  # nor this one
            return
        super().connection_made(transport)
        self._arm(self._limits.header_timeout_s, self._header_missed)

    def data_received(self, data: bytes) -> None:
        if self._admission is Admission.REPLY_503:
            return  # the request of a refused connection: read (so its close is no reset) and dropped
        if self._phase == _IDLE:  # a new request begins: its headers get their deadline from now
            self._phase = _HEAD
            self._arm(self._limits.header_timeout_s, self._header_missed)
        if self._phase == _HEAD:
            self._got_bytes = True
        super().data_received(data)

    def eof_received(self) -> None:
        if self._admission is Admission.REPLY_503 and self._refused is not None:
            self._refused.close()  # the client read its 503 and left
        super().eof_received()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._admission is Admission.RESET:
            return
        self._cancel_timer()
        self._phase = _CLOSED
        admission, self._admission = self._admission, Admission.RESET  # released once
        self._limits.release(admission)
        if admission is Admission.ADMIT:
            super().connection_lost(exc)

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        """aiohttp's own answers (parser errors: 400) in the API's error shape."""
        super().handle_error(request, status, exc, message)  # logs; raises if a response was begun
        return error_response(wire_error(exc, status, self._max_header))

    # ---- called by the middleware and the body reader ----------------------------------------
    def request_started(self, request: web.BaseRequest) -> None:
        self._cancel_timer()
        self._phase = _BUSY
        self._got_bytes = False
        self._body = request.content

    def request_finished(self) -> None:
        self._body = None
        if self._phase == _BUSY:
            self._phase = _IDLE
            self._arm(self._limits.keepalive_timeout_s, self._idle_expired)

    def body_missed(self, shape: Shape | None = None) -> ApiError:
        """The body deadline passed: answer 408 (in `shape`, else OpenAI's) and close; the returned
        error unwinds the handler."""
        err = read_timeout("body", self._limits.body_timeout_s, "server.body_timeout_s")
        self._limits.timed_out("body", self._peer)
        self._shut(raw_response(err, None if shape is None else shape(err)))
        return err

    def body_error(self, exc: HttpProcessingError) -> None:
        """The parser failed inside the body being read: that read fails, instead of waiting."""
        body = self._body
        if body is not None and not body.is_eof():
            body.set_exception(exc)
            body.feed_eof()  # nothing left to linger on: the answer is the connection's last

    # ---- timers ------------------------------------------------------------------------------
    def _arm(self, delay: float, callback: Any) -> None:
        self._cancel_timer()
        self._timer = self._loop.call_later(delay, callback)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _header_missed(self) -> None:
        self._timer = None
        if self._phase != _HEAD:
            return
        self._limits.timed_out("header", self._peer)
        err = read_timeout("headers", self._limits.header_timeout_s, "server.header_timeout_s")
        self._shut(raw_response(err) if self._got_bytes else None)

    def _idle_expired(self) -> None:
        self._timer = None
        if self._phase != _IDLE:
            return
        transport = self.transport
        if transport is not None and transport.get_write_buffer_size():
            # The last response is still on its way to a slow reader: not idle yet.
            self._arm(self._limits.keepalive_timeout_s, self._idle_expired)
            return
        self._limits.timed_out("keepalive", self._peer)
        self._shut(None)

    def _refuse(self, transport: Any) -> None:
        """Over the cap: the 503 at once, before any request (HTTP lets a server answer early),
        then a half-close. The client sends its request and reads the answer; the connection
        closes when the client does, or after `reject_lifetime_s` whatever it does."""
        self._refused = transport
        transport.write(raw_response(too_many_connections(self._limits.cap)))
        if transport.can_write_eof():
            transport.write_eof()
        self._arm(self._limits.reject_lifetime_s, self._drop_refused)

    def _drop_refused(self) -> None:
        self._timer = None
        if self._refused is not None:
            self._refused.abort()

    def _shut(self, last_words: bytes | None) -> None:
        transport = self.transport
        if transport is None or self._phase == _CLOSED:
            return
        self._phase = _CLOSED
        if last_words is not None:
            transport.write(last_words)
        self.force_close()  # aiohttp's own close: stops its request loop, closes the transport
        if transport.get_write_buffer_size():
            self._loop.call_later(_CLOSE_GRACE_S, transport.abort)


class _BodyErrorRelay:
    """Stands in for aiohttp's parser: a parser error raised while a request body is being read
    also fails that read (aiohttp would only queue the error behind it)."""

    __slots__ = ("_inner", "_owner")

    def __init__(self, inner: Any, owner: ApiRequestHandler) -> None:
        self._inner = inner
        self._owner = owner

    def feed_data(self, data: bytes) -> Any:
        try:
            return self._inner.feed_data(data)
        except HttpProcessingError as exc:
            self._owner.body_error(exc)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _reset(transport: Any) -> None:
    """Close with a TCP reset (SO_LINGER 0): the client learns at once, no TIME_WAIT is left."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def connection_of(request: web.BaseRequest) -> ApiRequestHandler | None:
    proto = request.protocol
    return proto if isinstance(proto, ApiRequestHandler) else None


async def read_body(request: web.BaseRequest, timeout: float, shape: Shape | None = None) -> bytes:
    """The whole body, within `timeout` seconds (`server.body_timeout_s`); `shape`: the route's API's
    error body, for the 408 written straight to the socket (None: OpenAI's)."""
    try:
        async with asyncio.timeout(timeout):
            return await request.read()
    except TimeoutError:
        conn = connection_of(request)
        if conn is None:
            raise read_timeout("body", timeout, "server.body_timeout_s") from None
        raise conn.body_missed(shape) from None
    except HttpProcessingError as exc:
        raise wire_error(exc) from exc
    except web.RequestPayloadError as exc:
        # aiohttp's parser failed on the body itself (e.g. a Content-Encoding it could not decode)
        # and failed the read with this wrapper. The rest of the body is not drained: the answer
        # closes the connection (wire_error), and without EOF aiohttp would read on after it.
        request.content.feed_eof()
        cause = exc.__cause__
        raise wire_error(cause if isinstance(cause, HttpProcessingError) else None) from exc
