"""An `ApiError` as an aiohttp response: the one place the protocol layer's errors meet aiohttp."""

from __future__ import annotations

from aiohttp import web
from rillet.http.openai.errors import JSON_CONTENT_TYPE, ApiError


def error_response(err: ApiError, body: bytes | None = None) -> web.Response:
    """`body`: the error as another API shapes it (None: OpenAI's)."""
    resp = web.Response(
        status=err.status,
        body=err.to_json() if body is None else body,
        content_type=JSON_CONTENT_TYPE,
        headers=err.headers,
    )
    if err.close:
        resp.force_close()  # the request stream is unusable: no keep-alive after this answer
    return resp
