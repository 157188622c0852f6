"""A burst of streamed requests reaches the engine before any of them writes its headers.

Streamed or not, a request's handler submits it to the engine; a streamed one then prepares its
response (headers, head event, two sends). Were that done request by request, each request of a
burst would wait for the headers of all before it, and a burst would start over more engine steps
than the same burst not streamed (bench/RESULTS.md, null engine at 256 streams).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from fake_engine import FakeEngine
from http_helpers import serving, wait_for
from pytest import MonkeyPatch

BURST = 6


def _request(port: int, i: int) -> tuple[bytes, bytes]:
    """A streamed chat request, split in two: its request line, then the rest."""
    messages = [{"role": "user", "content": f"hi {i}"}]
    body = orjson.dumps({"model": "fake-model", "messages": messages, "max_tokens": 3, "stream": True})
    line = b"POST /v1/chat/completions HTTP/1.1\r\n"
    rest = (
        f"Host: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    return line, rest


async def _settle() -> None:
    for _ in range(3):  # a transport starts reading a loop pass after it is made
        await asyncio.sleep(0)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _record(engine: FakeEngine, monkeypatch: MonkeyPatch) -> list[str]:
    """The order, on the server's loop, of submissions to the engine and of streamed headers."""
    events: list[str] = []
    submit: Callable[..., Any] = engine.add_requests
    prepare = web.StreamResponse.prepare

    def add_requests(requests: Any) -> None:
        events.append("submit")
        submit(requests)

    async def prepared(self: web.StreamResponse, request: web.Request) -> Any:
        if not self.prepared:  # aiohttp prepares a handler's answer again, as a no-op
            events.append("headers")
        return await prepare(self, request)

    monkeypatch.setattr(engine, "add_requests", add_requests)
    monkeypatch.setattr(web.StreamResponse, "prepare", prepared)
    return events


def test_a_burst_is_submitted_before_any_headers_go_out(
    make_fake: Callable[..., FakeEngine], monkeypatch: MonkeyPatch
) -> None:
    engine = make_fake()
    events = _record(engine, monkeypatch)
    with serving(engine) as srv:
        port = srv.port
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(BURST)]
        parts = [_request(port, i) for i in range(BURST)]
        for sock, (line, _) in zip(socks, parts, strict=True):
            sock.sendall(line)  # the server accepts and reads every connection before the burst
        wait_for(lambda: srv.state.connections.open == BURST, what="every connection accepted")
        srv.call(_settle())  # ... and its transport reading
        blocked = threading.Event()

        def hold_the_loop() -> None:  # the whole burst is then read in one pass of the loop
            blocked.set()
            time.sleep(0.3)

        srv.loop.call_soon_threadsafe(hold_the_loop)
        blocked.wait(10)
        for sock, (_, rest) in zip(socks, parts, strict=True):
            sock.sendall(rest)
        answers = [_read_all(sock) for sock in socks]
        for sock in socks:
            sock.close()
    assert all(a.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in a for a in answers)
    assert events == ["submit"] * BURST + ["headers"] * BURST
