"""Slow and idle connections, one mechanism at a time, over raw sockets (http/net/connection.py).

Deadlines are short here (1 s) so each test is quick; assertions are on what happens (closed, 408,
counted), with lower bounds on time only (a timer never fires early; on a busy machine it fires late).
The many-connection attack is test_slowloris.py; the long run tests/stress/slowloris.py.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from rel_helpers import COMP, is_openai_error, request, served, wait_for
from rillet.http.background import BackgroundServer
from rillet.http.net.conn_limits import effective_cap

DEADLINE_S = 1.0
DEADLINES = (
    "model.synthetic_step_ms=10",
    f"server.header_timeout_s={DEADLINE_S}",
    f"server.body_timeout_s={DEADLINE_S}",
    f"server.keepalive_timeout_s={DEADLINE_S}",
)
HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Any, BackgroundServer]]:
    with served(*DEADLINES) as (engine, srv):
        yield engine, srv


def _connect(srv: BackgroundServer) -> socket.socket:
    return socket.create_connection((srv.host, srv.port), timeout=30)


def _trickle_until_closed(s: socket.socket, data: bytes, every: float, limit: float = 30.0) -> bytes:
    """Sends `data` one byte per `every` seconds until the server closes; returns what it sent back."""
    s.settimeout(every)
    got = b""
    deadline = time.monotonic() + limit
    i = 0
    while time.monotonic() < deadline:
        try:
            s.send(data[i % len(data) : i % len(data) + 1])
            i += 1
            chunk = s.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
        if not chunk:
            break
        got += chunk
    s.settimeout(5)
    try:
        while chunk := s.recv(65536):
            got += chunk
    except (OSError, TimeoutError):
        pass
    return got


def _read_until_closed(s: socket.socket) -> bytes:
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    return got


def _response(data: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, orjson.loads(body) if body else None


def _timeouts(srv: BackgroundServer, deadline: str) -> float:
    text = request(srv, "GET", "/metrics").text
    for line in text.splitlines():
        if line.startswith(f'rillet_connection_timeouts_total{{deadline="{deadline}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no rillet_connection_timeouts_total for {deadline}")


def _assert_408(data: bytes, code: str) -> None:
    status, headers, body = _response(data)
    assert status == 408, data[:300]
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert is_openai_error(body) and body["error"]["code"] == code, body


def test_slow_headers_get_408_and_are_closed(server: tuple[Any, BackgroundServer]) -> None:
    _, srv = server
    before = _timeouts(srv, "header")
    with _connect(srv) as s:
        t0 = time.monotonic()
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        got = _trickle_until_closed(s, b"X-Slow: a\r\n", every=0.2)  # a header byte every 0.2 s
        elapsed = time.monotonic() - t0
    _assert_408(got, "header_timeout")
    assert elapsed >= DEADLINE_S * 0.9
    assert _timeouts(srv, "header") == before + 1


def test_silent_connection_is_closed_without_an_answer(server: tuple[Any, BackgroundServer]) -> None:
    _, srv = server
    before = _timeouts(srv, "header")
    with _connect(srv) as s:
        t0 = time.monotonic()
        assert _read_until_closed(s) == b""  # connected, sent nothing: closed, nothing to answer
        assert time.monotonic() - t0 >= DEADLINE_S * 0.9
    assert _timeouts(srv, "header") == before + 1


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/messages"])
def test_slow_body_gets_408_and_is_closed(server: tuple[Any, BackgroundServer], path: str) -> None:
    """In the route's API's shape: Anthropic's on /v1/messages."""
    engine, srv = server
    before = _timeouts(srv, "body")
    body = orjson.dumps({"model": engine.model_name, "prompt": "x" * 200})
    head = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" % path.encode()
    with _connect(srv) as s:
        t0 = time.monotonic()
        s.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body[:20])
        got = _trickle_until_closed(s, body[20:], every=0.2)  # slower than the deadline allows
        elapsed = time.monotonic() - t0
    if path == "/v1/messages":
        status, _, answer = _response(got)
        assert status == 408 and answer["type"] == "error", answer
        assert answer["error"]["type"] == "invalid_request_error" and "body" in answer["error"]["message"]
    else:
        _assert_408(got, "body_timeout")
    assert elapsed >= DEADLINE_S * 0.9
    assert _timeouts(srv, "body") == before + 1


def test_idle_keepalive_connection_is_closed(server: tuple[Any, BackgroundServer]) -> None:
    _, srv = server
    before = _timeouts(srv, "keepalive")
    with _connect(srv) as s:
        s.sendall(HEALTH)
        first = s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first
        t0 = time.monotonic()
        assert _read_until_closed(s) == b""  # idle after its answer: closed, silently
        assert time.monotonic() - t0 >= DEADLINE_S * 0.9
    assert _timeouts(srv, "keepalive") == before + 1


def test_a_busy_connection_is_kept(server: tuple[Any, BackgroundServer]) -> None:
    """Requests closer together than the idle deadline, for longer than it: one connection throughout."""
    _, srv = server
    with _connect(srv) as s:
        for _ in range(8):  # 8 x 0.25 s = 2 s: twice the idle deadline
            s.sendall(HEALTH)
            data = b""
            while not data.endswith(b"}"):  # /health answers a small JSON object
                chunk = s.recv(65536)
                assert chunk, "the server closed a connection in use"
                data += chunk
            assert data.startswith(b"HTTP/1.1 200"), data
            time.sleep(0.25)


def test_long_stream_outlives_the_read_deadlines(server: tuple[Any, BackgroundServer]) -> None:
    """Generation is not a read: a 2.5 s stream on 1 s read deadlines runs to its end."""
    engine, srv = server
    body = {"model": engine.model_name, "prompt": "x", "max_tokens": 250, "ignore_eos": True, "stream": True}
    t0 = time.monotonic()
    resp = request(srv, "POST", COMP, body)
    assert resp.status_code == 200
    assert time.monotonic() - t0 >= 2 * DEADLINE_S
    assert resp.content.rstrip().endswith(b"data: [DONE]")


# ---- the connection cap ------------------------------------------------------------------------


def _hold(srv: BackgroundServer) -> socket.socket:
    """An admitted connection, left idle after one request."""
    s = _connect(srv)
    s.sendall(HEALTH)
    assert s.recv(65536).startswith(b"HTTP/1.1 200")
    return s


def _assert_reset(srv: BackgroundServer) -> None:
    """The connection is reset, whenever the client notices (connect, send or receive)."""
    with pytest.raises(ConnectionResetError), _connect(srv) as s:
        s.sendall(HEALTH)
        s.recv(65536)


def test_over_the_cap_a_new_connection_gets_503() -> None:
    cap = ("server.max_connections=3", "server.header_timeout_s=30", "server.keepalive_timeout_s=30")
    with served(*cap) as (_, srv):
        limits = srv.state.connections
        held = [_hold(srv) for _ in range(3)]
        assert limits.open == 3
        with _connect(srv) as s:  # over the cap: a 503 in the API's shape, then closed
            s.sendall(HEALTH)
            status, headers, body = _response(_read_until_closed(s))
        assert status == 503 and headers["retry-after"] == "1", body
        assert headers["content-type"] == "application/json"
        assert is_openai_error(body) and body["error"]["code"] == "too_many_connections", body
        # The 503 comes at once, before any request; past the 503 budget (8 open at a time with
        # this cap) the next connection is reset at once. Silent ones are closed 1 s later.
        wait_for(lambda: limits.replying == 0, 10, "the answered connection closed")  # the client closed it
        silent = [_connect(srv) for _ in range(8)]
        wait_for(lambda: limits.replying == 8, 10, "8 over-cap connections")
        _assert_reset(srv)
        for s in silent:
            assert _response(_read_until_closed(s))[0] == 503
        wait_for(lambda: limits.replying == 0, 10, "over-cap connections closed")
        for s in silent:
            s.close()
        held.pop().close()  # room again: the next connection is served
        wait_for(lambda: limits.open == 2, 10, "a held connection released")
        assert request(srv, "GET", "/health").status_code == 200
        metrics = request(srv, "GET", "/metrics").text
        for s in held:
            s.close()
    assert 'rillet_connections_rejected_total{action="reply_503"} 9.0' in metrics
    assert 'rillet_connections_rejected_total{action="reset"} 1.0' in metrics
    assert "rillet_max_connections 3.0" in metrics
    assert "rillet_open_connections 3.0" in metrics  # 2 held + the scrape's own


def test_over_the_cap_reset_mode_resets_at_once() -> None:
    cap = ("server.max_connections=1", "server.over_capacity=reset", "server.keepalive_timeout_s=30")
    with served(*cap) as (_, srv):
        with _hold(srv):
            _assert_reset(srv)
            assert srv.state.connections.replying == 0
        wait_for(lambda: srv.state.connections.open == 0, 10, "the held connection released")
        assert 'rillet_connections_rejected_total{action="reset"} 1.0' in request(srv, "GET", "/metrics").text


def test_cap_fits_the_descriptor_limit() -> None:
    assert effective_cap(4096, soft_limit=1_048_576, in_use=40) == 4096
    capped = effective_cap(4096, soft_limit=1024, in_use=40)
    assert capped < 1024 - 40 and capped + capped // 16 <= 1024 - 40 - 128
    assert effective_cap(4096, soft_limit=100, in_use=90) == 1


def test_raise_fd_limit_lifts_soft_to_hard() -> None:
    code = (
        "import resource, logging; logging.basicConfig(level=logging.INFO)\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "from rillet.http.launch.process_tuning import raise_fd_limit\n"
        "assert raise_fd_limit() == (hard, hard) == resource.getrlimit(resource.RLIMIT_NOFILE)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "open files limit: soft" in out.stderr and "(was 256)" in out.stderr, out.stderr
