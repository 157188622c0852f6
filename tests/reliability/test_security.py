"""Security: header and body limits, caps on max_tokens and n, API keys on every route but /health,
and no file-system path ever taken from a request."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from rel_helpers import CHAT, COMP, is_openai_error, post, request, served
from rillet.core.loaders.default_model import default_model_path
from rillet.http.background import BackgroundServer
from rillet.http.net.auth import ApiKeys

LIMITS = (
    "model.synthetic_step_ms=0",
    "server.max_header_bytes=4096",
    "server.max_body_bytes=65536",
    "server.max_tokens_cap=8",
    "server.max_n=2",
    "server.api_keys=[sekrit-1, sekrit-2]",
)
AUTH = {"Authorization": "Bearer sekrit-2"}


@pytest.fixture(scope="module")
def secure() -> Iterator[tuple[Any, BackgroundServer]]:
    with served(*LIMITS) as (engine, srv):
        yield engine, srv


def _raw(srv: BackgroundServer, data: bytes) -> tuple[int, bytes, bytes]:
    """Sends raw bytes on a fresh connection: (status, headers, body)."""
    with socket.create_connection((srv.host, srv.port), timeout=15) as s:
        s.sendall(data)
        out = b""
        while b"\r\n\r\n" not in out or len(out.partition(b"\r\n\r\n")[2]) < _length(out):
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    return int(head.split()[1]), head, body


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def _assert_api_error(status: int, body: bytes, expected: int, code: str | None = None) -> None:
    assert status == expected, (status, body[:300])
    err = orjson.loads(body)
    assert is_openai_error(err), err
    assert code is None or err["error"]["code"] == code, err


def test_header_limits(secure: tuple[Any, BackgroundServer]) -> None:
    engine, srv = secure
    auth = b"Authorization: Bearer sekrit-1\r\n"
    # One header line over the limit: aiohttp's parser refuses it before any handler runs (431 in
    # the API's shape: connection.py answers aiohttp's parser errors; test_wire_errors.py has all).
    status, _, body = _raw(
        srv, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + auth + b"X-Big: " + b"a" * 5000 + b"\r\n\r\n"
    )
    _assert_api_error(status, body, 431, "request_header_fields_too_large")
    # Many small headers, over the limit together: 431 in the API's error shape.
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 100) for i in range(60))
    status, _, body = _raw(srv, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + auth + many + b"\r\n")
    _assert_api_error(status, body, 431, "request_header_fields_too_large")
    # More headers than aiohttp parses at all.
    lots = b"".join(b"X-%d: 1\r\n" % i for i in range(200))
    status, _, body = _raw(srv, b"GET /health HTTP/1.1\r\nHost: x\r\n" + lots + b"\r\n")
    _assert_api_error(status, body, 431, "request_header_fields_too_large")
    # A request line over the limit.
    status, _, body = _raw(srv, b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    _assert_api_error(status, body, 431, "request_header_fields_too_large")
    assert_serves_with_key(srv, engine.model_name)


def test_body_limits(secure: tuple[Any, BackgroundServer]) -> None:
    engine, srv = secure
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit-1\r\n"
    # Declared too large: refused at once, without waiting for a body that never comes.
    status, _, body = _raw(srv, head + b"Content-Length: 999999999\r\nConnection: close\r\n\r\n{}")
    _assert_api_error(status, body, 413, "request_too_large")
    # Chunked, no declared length: cut off once the limit is passed while reading.
    payload = orjson.dumps({"model": engine.model_name, "prompt": "x" * 100_000})
    chunked = b"".join(
        b"%x\r\n%s\r\n" % (len(payload[i : i + 4096]), payload[i : i + 4096])
        for i in range(0, len(payload), 4096)
    )
    status, _, body = _raw(
        srv, head + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked + b"0\r\n\r\n"
    )
    _assert_api_error(status, body, 413, "request_too_large")
    assert_serves_with_key(srv, engine.model_name)


@pytest.mark.parametrize(
    ("path", "over", "at_cap"),
    [
        (COMP, {"max_tokens": 9}, {"max_tokens": 8}),
        (CHAT, {"max_completion_tokens": 9}, {"max_completion_tokens": 8}),
        (COMP, {"n": 3}, {"n": 2}),
        (CHAT, {"n": 3}, {"n": 2}),
        (COMP, {"logprobs": 21}, None),
        (CHAT, {"logprobs": True, "top_logprobs": 21}, None),
    ],
)
def test_caps(
    secure: tuple[Any, BackgroundServer], path: str, over: dict[str, Any], at_cap: dict[str, Any] | None
) -> None:
    engine, srv = secure
    base: dict[str, Any] = {"model": engine.model_name, "prompt": "hi"}
    if path == CHAT:
        base = {"model": engine.model_name, "messages": [{"role": "user", "content": "hi"}]}
    resp = post(srv, path, {**base, **over}, AUTH)
    _assert_api_error(resp.status_code, resp.content, 400)
    assert resp.json()["error"]["param"] == list(over)[-1]
    if at_cap is not None:
        assert post(srv, path, {**base, **at_cap}, AUTH).status_code == 200


def test_no_max_tokens_gets_at_most_the_cap(secure: tuple[Any, BackgroundServer]) -> None:
    """server.default_max_tokens (1024) is above this server's cap (8): the cap bounds it too."""
    engine, srv = secure
    resp = post(srv, COMP, {"model": engine.model_name, "prompt": "hi", "ignore_eos": True}, AUTH)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 8


ROUTES = [
    ("GET", "/v1/models"),
    ("GET", "/v1/models/synthetic"),
    ("GET", "/metrics"),
    ("POST", CHAT),
    ("POST", COMP),
    ("GET", "/v1/does-not-exist"),  # no route discovery without a key either
    ("DELETE", "/v1/models"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize(
    "key", [None, "Bearer wrong", "Bearer sekrit-1x", "Bearer ", "sekrit-1", "Basic sekrit-1"]
)
def test_every_route_but_health_needs_a_key(
    secure: tuple[Any, BackgroundServer], method: str, path: str, key: str | None
) -> None:
    _, srv = secure
    headers = {"Authorization": key} if key is not None else {}
    resp = request(srv, method, path, {"model": "synthetic", "prompt": "x"}, headers)
    _assert_api_error(resp.status_code, resp.content, 401, "invalid_api_key")
    assert request(srv, "GET", "/health", headers=headers).status_code == 200


def test_key_check_compares_against_every_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import hmac

    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    keys = ApiKeys(("k-one", "k-two", "k-three"))
    keys.check("/v1/models", "Bearer k-one")  # matches the first: the others are compared anyway
    assert len(calls) == 3
    with pytest.raises(Exception) as exc:
        keys.check("/v1/models", "Bearer nope")
    assert getattr(exc.value, "status", None) == 401 and len(calls) == 6


def test_model_field_is_never_a_path(secure: tuple[Any, BackgroundServer]) -> None:
    engine, srv = secure
    real_file = str(default_model_path())
    names = [
        real_file,
        "/etc/passwd",
        "../../../../etc/passwd",
        "file:///etc/passwd",
        "~/.ssh/id_rsa",
        "./synthetic",
    ]
    opened: list[str] = []
    watching = [True]

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if watching and event == "open" and args and isinstance(args[0], str | bytes):
            opened.append(str(args[0]))

    sys.addaudithook(audit)  # cannot be removed: it stops recording when `watching` is emptied
    try:
        for name in names:
            for path, body in (
                (CHAT, {"model": name, "messages": [{"role": "user", "content": "hi"}]}),
                (COMP, {"model": name, "prompt": "hi"}),
            ):
                resp = post(srv, path, body, AUTH)
                _assert_api_error(resp.status_code, resp.content, 404, "model_not_found")
            resp = request(srv, "GET", f"/v1/models/{name.lstrip('/')}", headers=AUTH)
            assert resp.status_code == 404
    finally:
        watching.clear()
    suspicious = [p for p in opened if any(part in p for part in ("passwd", "id_rsa", ".gguf", "synthetic"))]
    assert not suspicious, suspicious
    assert_serves_with_key(srv, engine.model_name)


def assert_serves_with_key(srv: BackgroundServer, model: str) -> None:
    resp = post(srv, COMP, {"model": model, "prompt": "ok?", "max_tokens": 3, "ignore_eos": True}, AUTH)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 3
