"""API errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`.

Every failure the server reports goes through `ApiError`; handlers raise it and the error
middleware (app.py, with net/responses.py) turns it into a response, so a bad request can never
surface as a 500. Plain data here: no aiohttp.
"""

from __future__ import annotations

from typing import Any

import orjson
from rillet.core.errors import AdapterError, EngineDeadError, ErrorKind, QueueFullError, RequestError
from rillet.core.sequence import FinishReason
from rillet.core.vision.image import ImageError

JSON_CONTENT_TYPE = "application/json"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.close = close  # end the connection after this answer (the request stream is unusable)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def to_json(self) -> bytes:
        return orjson.dumps(self.body())


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unsupported(param: str, what: str = "is not supported by this server") -> ApiError:
    return ApiError(400, f"'{param}' {what}", param=param, code="unsupported_parameter")


def image_refused(err: ImageError) -> ApiError:
    """A refused image (core/vision/image.py): the message and `param` name the part, `code` is the
    error's kind (not_base64, too_many_pixels, forbidden, not_supported, ...)."""
    return ApiError(400, str(err), param=err.part, code=err.kind.value)


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model '{model}' does not exist", param="model", code="model_not_found")


def unavailable(phase: str, detail: str = "") -> ApiError:
    message = {
        "starting": "The server is starting: the model is still loading",
        "draining": "The server is shutting down and accepts no new requests",
        "dead": "The inference engine has stopped",
    }.get(phase, "The server is not ready")
    if detail:
        message = f"{message}: {detail}"
    return ApiError(503, message, type="service_unavailable_error", code=phase, headers={"Retry-After": "1"})


def queue_full(detail: str) -> ApiError:
    return ApiError(
        429,
        f"The server is at capacity ({detail}); retry shortly",
        type="rate_limit_error",
        code="queue_full",
        headers={"Retry-After": "1"},
    )


def engine_refusal(exc: Exception) -> ApiError | None:
    """What an engine's refusal to queue a request (Engine.add_requests / add_embeddings) answers;
    None for any other exception (unexpected: re-raised, the middleware logs it and answers 500)."""
    if isinstance(exc, QueueFullError):
        return queue_full(str(exc))
    if isinstance(exc, EngineDeadError):
        return unavailable("dead", str(exc))
    if isinstance(exc, AdapterError):  # unloaded between the check of `model` and now
        return model_not_found(exc.name)
    if isinstance(exc, RequestError):  # the engine's own input checks
        return bad_request(f"'{exc.param}' {exc.message}", param=exc.param)
    return None


def from_http_status(
    status: int, reason: str | None, method: str, path: str, allow: str | None = None
) -> ApiError:
    """The HTTP framework's own 404/405/413 (routing, body size) in our shape; `allow`: a 405's
    methods (its Allow header, which HTTP requires)."""
    if status == 404:
        return ApiError(404, f"Invalid URL ({method} {path})", code="unknown_url")
    if status == 405:
        headers = {"Allow": allow} if allow else None
        return ApiError(
            405, f"Method {method} is not allowed on {path}", code="method_not_allowed", headers=headers
        )
    if status == 413:
        return ApiError(413, "Request body is too large", code="request_too_large")
    code = "server_error" if status >= 500 else "invalid_request_error"
    return ApiError(status, reason or "HTTP error", type=code)


def internal_error() -> ApiError:
    return ApiError(
        500, "Internal server error; see the server log", type="server_error", code="internal_error"
    )


def headers_too_large(size: int, limit: int) -> ApiError:
    return ApiError(
        431,
        f"Request headers are too large ({size} bytes; limit: {limit})",
        code="request_header_fields_too_large",
    )


def engine_dead(detail: str | None) -> ApiError:
    return ApiError(
        503,
        f"the inference engine stopped: {detail or 'unknown error'}",
        type="service_unavailable_error",
        code="dead",
    )


def finish_failure(reason: FinishReason | None, error: str | None, kind: ErrorKind | None) -> ApiError | None:
    """An ERROR / ABORT end the client should hear about (its own disconnects never get that far)."""
    if reason is FinishReason.ERROR:
        return _error_end(error, kind)
    if reason is FinishReason.ABORT:
        return ApiError(
            503,
            error or "the request was aborted by the server",
            type="service_unavailable_error",
            code="aborted",
        )
    return None


def _error_end(error: str | None, kind: ErrorKind | None) -> ApiError:
    if kind is ErrorKind.DEADLINE:
        return ApiError(
            504,
            "the request did not finish within the server's time limit (server.request_timeout_s)",
            type="timeout_error",
            code="deadline_exceeded",
        )
    if kind is ErrorKind.GRAMMAR:
        # the request's own grammar gave out mid-way (e.g. a schema past the grammar engine's limits)
        return ApiError(
            400,
            f"the output could not be continued under the requested grammar: {error}",
            param="response_format",
            code="grammar_error",
        )
    if kind is ErrorKind.ENGINE_DEAD:
        return engine_dead(error)
    return ApiError(
        500, f"generation failed: {error or 'unknown error'}", type="server_error", code="generation_error"
    )
