"""What one finished generation request's span says: plain data gathered from the request's parsed
body, its stream (timings, each choice's end) and how its handler ended. No opentelemetry here."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from rillet.http.openai.chunks import Usage
from rillet.http.openai.errors import ApiError, finish_failure
from rillet.http.openai.protocol import GenRequest
from rillet.http.stream.request_stream import RequestStream

# The HTTP status nginx logs for a client that closed the connection before the answer.
CLIENT_CLOSED = 499


@dataclass(frozen=True)
class Outcome:
    """How the request ended: its HTTP status and, when it failed, the error's code and message."""

    status: int
    error_type: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class RequestFacts:
    operation: str  # GenAI operation name: chat | text_completion
    model: str
    response_id: str
    method: str
    path: str
    stream: bool
    n: int
    max_tokens: int
    temperature: float
    top_p: float
    input_tokens: int
    output_tokens: int
    finish_reasons: tuple[str, ...]
    # time.monotonic() instants; None when the request never got that far
    arrival: float
    scheduled: float | None
    first_token: float | None
    last_token: float | None
    end: float
    outcome: Outcome


def request_facts(
    method: str,
    path: str,
    gen: GenRequest,
    model: str,
    response_id: str,
    stream: RequestStream,
    usage: Usage,
    outcome: Outcome,
) -> RequestFacts:
    params = gen.params[0]
    scheduled = [d.scheduled_at for d in stream.ends if d.scheduled_at is not None]
    first = stream.first_token_at
    return RequestFacts(
        operation="chat" if gen.kind == "chat" else "text_completion",
        model=model,
        response_id=response_id,
        method=method,
        path=path,
        stream=gen.stream,
        n=gen.n,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        finish_reasons=tuple(d.finish_reason.value for d in stream.ends if d.finish_reason is not None),
        arrival=stream.arrival,
        scheduled=min(scheduled) if scheduled else None,
        first_token=first,
        last_token=stream.last_token_at if first is not None else None,
        end=time.monotonic(),
        outcome=outcome,
    )


def outcome_of(error: BaseException | None, clean: bool, stream: RequestStream) -> Outcome:
    """`error`: what the handler raised, if anything; `clean`: it ran to its end. A streamed request
    that failed has already sent its 200 and ends with an error event: its cause is on the stream."""
    if isinstance(error, ApiError):
        return Outcome(error.status, error.code or error.type, error.message)
    if isinstance(error, asyncio.CancelledError):
        return Outcome(CLIENT_CLOSED, "cancelled", "the client went away before the answer")
    if error is not None:
        return Outcome(500, type(error).__qualname__, str(error))
    if clean:
        return Outcome(200)
    failure = stream.failure or _end_failure(stream)
    if failure is not None:
        return Outcome(200, failure.code or failure.type, failure.message)
    return Outcome(200, "client_disconnected", "the client went away mid-stream")


def _end_failure(stream: RequestStream) -> ApiError | None:
    for d in stream.ends:
        failure = finish_failure(d.finish_reason, d.error, d.error_kind)
        if failure is not None:
            return failure
    return None
