"""What aiohttp's HTTP parser refuses comes back in the OpenAI error shape, over raw sockets.

aiohttp answers these itself (text/plain 400s) before any middleware runs; http/net/connection.py
overrides `RequestHandler.handle_error` for them, so these tests pin that aiohttp internal. A bad
chunk arriving while the handler already reads the body used to leave the request waiting forever
(aiohttp queued the error behind it); it is now that request's answer.
"""

from __future__ import annotations

import gzip
import logging
import socket
import time
import zlib
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from rel_helpers import is_openai_error, served
from rillet.http.background import BackgroundServer

CONFIG = ("model.synthetic_step_ms=0", "server.max_header_bytes=4096")
POST = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
CHUNKED = POST + b"Transfer-Encoding: chunked\r\n\r\n"

CASES: list[tuple[str, bytes, int, str]] = [
    ("garbage request line", b"GARBAGE\r\n\r\n", 400, "bad_request_line"),
    ("bad method", b"G@T /health HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request_line"),
    ("bad version", b"GET /health HTTP/9.x\r\nHost: x\r\n\r\n", 400, "bad_request_line"),
    (
        "TLS on the plain port",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 32,
        400,
        "bad_request_line",
    ),
    (
        "request line too long",
        b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        431,
        "request_header_fields_too_large",
    ),
    (
        "header value too long",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n",
        431,
        "request_header_fields_too_large",
    ),
    (
        "header name too long",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX" + b"a" * 5000 + b": 1\r\n\r\n",
        431,
        "request_header_fields_too_large",
    ),
    (
        "too many headers",
        b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
        431,
        "request_header_fields_too_large",
    ),
    (
        "header without a colon",
        b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        400,
        "bad_http_message",
    ),
    ("no Host in HTTP/1.1", b"GET /health HTTP/1.1\r\n\r\n", 400, "bad_http_message"),
    ("bad chunk size", CHUNKED + b"zz\r\n{}\r\n0\r\n\r\n", 400, "bad_http_message"),
    ("chunk data overrun", CHUNKED + b"2\r\n{}xx\r\n0\r\n\r\n", 400, "bad_http_message"),
    ("bad Transfer-Encoding", POST + b"Transfer-Encoding: gzip, chunked, x\r\n\r\n", 400, "bad_http_message"),
    (
        "Content-Length with chunked",
        POST + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        400,
        "bad_http_message",
    ),
    ("bad Content-Length", POST + b"Content-Length: 12a\r\n\r\n", 400, "bad_http_message"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Any, BackgroundServer]]:
    with served(*CONFIG) as (engine, srv):
        yield engine, srv


def _exchange(
    srv: BackgroundServer, parts: list[bytes], pause: float = 0.0
) -> tuple[int, dict[str, str], bytes]:
    """Sends `parts` (pausing between them), reads until the server closes: (status, headers, body)."""
    with socket.create_connection((srv.host, srv.port), timeout=20) as s:
        for i, part in enumerate(parts):
            if i:
                time.sleep(pause)
            s.sendall(part)
        data = b""
        while chunk := s.recv(65536):  # the server closes after answering: the loop ends
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _assert_error(got: tuple[int, dict[str, str], bytes], status: int, code: str) -> dict[str, Any]:
    got_status, headers, body = got
    assert got_status == status, (got_status, body[:300])
    assert headers["content-type"].split(";")[0] == "application/json", headers
    assert int(headers["content-length"]) == len(body)
    err = orjson.loads(body)
    assert is_openai_error(err), err
    assert err["error"]["code"] == code, err
    assert err["error"]["type"] == "invalid_request_error"
    return err


@pytest.mark.parametrize(("name", "data", "status", "code"), CASES, ids=[c[0] for c in CASES])
def test_parser_errors_in_the_api_shape(
    server: tuple[Any, BackgroundServer], name: str, data: bytes, status: int, code: str
) -> None:
    _, srv = server
    err = _assert_error(_exchange(srv, [data]), status, code)
    assert len(err["error"]["message"]) < 400  # aiohttp's detail quotes client bytes: bounded


def test_bad_chunk_while_the_body_is_being_read(server: tuple[Any, BackgroundServer]) -> None:
    """The handler is already waiting for the body when the bad chunk arrives."""
    engine, srv = server
    body = orjson.dumps({"model": engine.model_name, "prompt": "x"})
    first = CHUNKED + b"%x\r\n%s\r\n" % (len(body) // 2, body[: len(body) // 2])
    _assert_error(_exchange(srv, [first, b"qq\r\n"], pause=0.3), 400, "bad_http_message")
    # The same request with good chunks still works, on a fresh connection.
    half = len(body) // 2
    good = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:])
    status, _, answer = _exchange(
        srv, [CHUNKED.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"), good], 0.1
    )
    assert status == 200, answer
    assert orjson.loads(answer)["choices"][0]["text"]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_body_its_content_encoding_does_not_decode(
    server: tuple[Any, BackgroundServer], encoding: str, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp fails the body's read with its own wrapper: a 400 that closes the connection, not a
    500 and an 'unhandled exception' logged twice. The same body encoded right is served."""
    engine, srv = server
    body = orjson.dumps({"model": engine.model_name, "prompt": "x", "max_tokens": 2})

    def post(payload: bytes) -> bytes:
        head = b"Content-Encoding: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        return POST + head % (encoding.encode(), len(payload)) + payload

    with caplog.at_level(logging.ERROR):
        _assert_error(_exchange(srv, [post(body)]), 400, "bad_http_message")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    status, _, answer = _exchange(srv, [post(packed)])
    assert status == 200, answer
    assert orjson.loads(answer)["choices"][0]["text"]


def test_keeps_serving_after_every_bad_request(server: tuple[Any, BackgroundServer]) -> None:
    _, srv = server
    status, _, answer = _exchange(srv, [b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"])
    assert status == 200, answer
