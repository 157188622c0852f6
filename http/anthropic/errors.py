"""An `ApiError` in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`, same status.

The error's `type` follows the status as Anthropic's API does (its SDK picks the exception class
from the status: 400 BadRequestError, 401 AuthenticationError, 404 NotFoundError, 429
RateLimitError, ...). The field a 400 is about is named in the message, as the checks write it.
"""

from __future__ import annotations

from typing import Any

import orjson
from rillet.http.openai.errors import ApiError

# The routes that speak Anthropic's API: their errors (the middleware's, a body's 408) take its shape
MESSAGES_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def error_body(err: ApiError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(err.status), "message": err.message}}


def error_json(err: ApiError) -> bytes:
    return orjson.dumps(error_body(err))
