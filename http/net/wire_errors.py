"""Errors of the HTTP wire itself, in the OpenAI shape: what aiohttp's parser refuses (bad request
line, header too long, too many headers, bad chunked encoding...), the read deadlines, the
connection cap.

aiohttp answers its parser errors itself, as text/plain 400s, before any middleware runs;
connection.py routes them here instead. The deadline answers are written straight to the socket
(there is no request object to answer when the headers never finished), hence `raw_response`.
"""

from __future__ import annotations

import re
from http import HTTPStatus

from aiohttp.http_exceptions import BadStatusLine, HttpProcessingError, InvalidHeader, LineTooLong
from rillet.http.openai.errors import JSON_CONTENT_TYPE, ApiError

_DETAIL_CHARS = 200
_TOO_MANY_HEADERS = "Too many headers received"  # aiohttp's message (C and Python parsers alike)


def _detail(message: str) -> str:
    """aiohttp's message on one line, bounded: it quotes the client's bytes."""
    text = re.sub(r"\s+", " ", message).strip().removesuffix(" ^")  # aiohttp's column marker
    return text if len(text) <= _DETAIL_CHARS else text[:_DETAIL_CHARS] + "..."


def _malformed(what: str, exc: HttpProcessingError, code: str) -> ApiError:
    return ApiError(400, f"Malformed {what}: {_detail(exc.message)}", code=code, close=True)


def wire_error(exc: BaseException | None, status: int = 400, max_header_bytes: int = 0) -> ApiError:
    """The answer to a request aiohttp could not parse (or another error it answers itself)."""
    if isinstance(exc, LineTooLong):
        limit = f" (limit: {max_header_bytes} bytes, server.max_header_bytes)" if max_header_bytes else ""
        return ApiError(
            431,
            f"A request line or header field is too long{limit}",
            code="request_header_fields_too_large",
            close=True,
        )
    if isinstance(exc, HttpProcessingError) and exc.message == _TOO_MANY_HEADERS:
        return ApiError(431, "Too many header fields", code="request_header_fields_too_large", close=True)
    if isinstance(exc, BadStatusLine):  # BadHttpMethod too (e.g. TLS sent to this plain-HTTP port)
        return ApiError(
            400, f"Malformed request line: {_detail(exc.message)}", code="bad_request_line", close=True
        )
    if isinstance(exc, InvalidHeader):
        return ApiError(400, f"Malformed header: {_detail(exc.message)}", code="bad_header", close=True)
    if isinstance(exc, HttpProcessingError):  # framing: chunked encoding, Content-Length, ...
        return ApiError(
            400, f"Malformed HTTP request: {_detail(exc.message)}", code="bad_http_message", close=True
        )
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "HTTP error"
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return ApiError(status, phrase, type=kind, code="internal_error" if status >= 500 else None, close=True)


def read_timeout(part: str, seconds: float, key: str) -> ApiError:
    """408 for a request whose `part` ("headers", "body") did not arrive within its deadline."""
    return ApiError(
        408,
        f"The request {part} did not arrive within {seconds:g} s ({key})",
        type="timeout_error",
        code=f"{part.rstrip('s')}_timeout",
        close=True,
    )


def too_many_connections(limit: int) -> ApiError:
    return ApiError(
        503,
        f"The server is at its connection limit ({limit} open connections, server.max_connections); "
        "retry shortly",
        type="service_unavailable_error",
        code="too_many_connections",
        headers={"Retry-After": "1"},
        close=True,
    )


def raw_response(err: ApiError, body: bytes | None = None) -> bytes:
    """A whole HTTP/1.1 response for `err`, to write on a transport that has no request object.
    `body`: the error as another API shapes it (None: OpenAI's)."""
    body = err.to_json() if body is None else body
    head = (
        f"HTTP/1.1 {err.status} {HTTPStatus(err.status).phrase}\r\n"
        f"Content-Type: {JSON_CONTENT_TYPE}\r\n"
        f"Content-Length: {len(body)}\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in err.headers.items())
        + "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
