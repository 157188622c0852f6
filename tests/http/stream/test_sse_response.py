"""A streamed response's start: its status line and headers leave in the same send as its head
event (http/stream/sse_response.py), one send and one client wake-up fewer per streamed request;
a format without a head still sends its headers at once, before any token.

The sends are read where asyncio's socket transport is handed bytes, so what is checked is what
the server asked the kernel to send, not how the client's reads happened to split it."""

from __future__ import annotations

import asyncio.selector_events as selector_events
import http.client
from collections.abc import Callable
from typing import Any

import orjson
from fake_engine import FakeEngine
from http_helpers import serving
from pytest import MonkeyPatch

Transport = selector_events._SelectorSocketTransport  # asyncio's TCP transport on Linux


def _record_sends(monkeypatch: MonkeyPatch) -> list[bytes]:
    """Each payload the server's TCP transports were handed, in order."""
    sends: list[bytes] = []
    write = Transport.write

    def recording(self: Any, data: Any) -> None:
        sends.append(bytes(data))
        write(self, data)

    monkeypatch.setattr(Transport, "write", recording)
    if "writelines" in vars(Transport):  # Python >= 3.12 has its own; 3.11's calls write
        writelines = Transport.writelines

        def recording_lines(self: Any, chunks: Any) -> None:
            sends.append(b"".join(bytes(c) for c in chunks))
            writelines(self, chunks)

        monkeypatch.setattr(Transport, "writelines", recording_lines)
    return sends


def _post(port: int, path: str, body: dict[str, Any]) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", path, orjson.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    data = resp.read()
    conn.close()
    return data


def test_headers_leave_with_the_head_event(
    make_fake: Callable[..., FakeEngine], monkeypatch: MonkeyPatch
) -> None:
    engine = make_fake()
    with serving(engine) as srv:
        sends = _record_sends(monkeypatch)
        messages = [{"role": "user", "content": "hi"}]
        body = {"model": "fake-model", "messages": messages, "max_tokens": 3, "stream": True}
        data = _post(srv.port, "/v1/chat/completions", body)
    assert data.endswith(b"data: [DONE]\n\n")
    first = next(s for s in sends if s.startswith(b"HTTP/1.1 200"))
    assert b"text/event-stream" in first
    assert b'"role":"assistant"' in first  # the head event (the role chunk) is in the same send


def test_without_a_head_the_headers_go_out_at_once(
    make_fake: Callable[..., FakeEngine], monkeypatch: MonkeyPatch
) -> None:
    engine = make_fake()
    with serving(engine) as srv:
        sends = _record_sends(monkeypatch)
        body = {"model": "fake-model", "prompt": "hi", "max_tokens": 3, "stream": True}
        data = _post(srv.port, "/v1/completions", body)
    assert data.endswith(b"data: [DONE]\n\n")
    at = next(i for i, s in enumerate(sends) if s.startswith(b"HTTP/1.1 200"))
    assert b"data:" not in sends[at]  # alone: not held back for the first token
    assert any(b"data:" in s for s in sends[at + 1 :])
