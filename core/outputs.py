"""What the engine publishes each step: one `StepOutput` per step through the ring."""

from __future__ import annotations

from dataclasses import dataclass

from rillet.core.errors import ErrorKind
from rillet.core.sequence import FinishReason, TokenLogprob


@dataclass(slots=True)
class SeqDelta:
    """New tokens of one sequence (one choice of a request) in one step."""

    request_id: str
    index: int  # choice index within the request (n > 1)
    token_ids: list[int]
    text: str  # decoded text for token_ids (held-back stop-string prefixes excluded)
    logprobs: list[TokenLogprob] | None
    finish_reason: FinishReason | None  # set on the sequence's last delta
    prompt_tokens: int
    cached_tokens: int  # prompt tokens reused from the prefix cache
    completion_tokens: int  # total so far
    error: str | None = None  # with finish_reason ERROR: why this request failed (text)
    error_kind: ErrorKind | None = None  # ... and its kind
    stop_str: str | None = None  # with finish_reason STOP: the stop string that ended it, if one did
    # An embedding request's vector, on its one (final) delta: little-endian float32 bytes, as
    # OpenAI's base64 encoding carries them (the HTTP layer encodes them without a float list)
    embedding: bytes | None = None
    # params.prompt_logprobs, on choice 0's first delta: the logprobs of prompt tokens 1.. (token 0
    # has none: nothing comes before it)
    prompt_logprobs: list[TokenLogprob] | None = None
    # On a sequence's final delta: when the scheduler first admitted it (time.monotonic()), so the
    # HTTP side can tell queueing from prefill (its tracing spans); None if it never was.
    scheduled_at: float | None = None


@dataclass(slots=True)
class StepOutput:
    step: int
    deltas: list[SeqDelta]
