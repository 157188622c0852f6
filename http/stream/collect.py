"""The non-streaming consumer: the same stream state as SSE, folded into each choice's result
(openai/bodies.py turns the results into the response body)."""

from __future__ import annotations

from rillet.core.outputs import SeqDelta
from rillet.http.openai.bodies import ChoiceResult
from rillet.http.openai.chunks import Usage
from rillet.http.openai.errors import ApiError, finish_failure
from rillet.http.stream.request_stream import RequestStream


class _Collector:
    """Folds one request's deltas into its choices' results as they arrive (a stream's sink)."""

    __slots__ = ("failure", "results", "usage")

    def __init__(self, num_choices: int, usage: Usage, want_logprobs: bool) -> None:
        self.results = [ChoiceResult(logprobs=[] if want_logprobs else None) for _ in range(num_choices)]
        self.usage = usage
        self.failure: ApiError | None = None  # the first failed choice's error: raised at the end

    def add(self, d: SeqDelta) -> None:
        self.usage.update(d.index, d.completion_tokens, d.cached_tokens)
        r = self.results[d.index]
        r.texts.append(d.text)
        if d.logprobs is not None and r.logprobs is not None:
            r.logprobs.extend(d.logprobs)
        if d.prompt_logprobs is not None:
            r.prompt_logprobs = d.prompt_logprobs
        if d.finish_reason is not None:
            failure = finish_failure(d.finish_reason, d.error, d.error_kind)
            if failure is None:
                r.finish_reason = d.finish_reason.value
                r.stop_str = d.stop_str
            elif self.failure is None:
                self.failure = failure


async def collect(stream: RequestStream, usage: Usage, want_logprobs: bool) -> list[ChoiceResult]:
    """Waits for every choice to end; raises the request's ApiError if it failed. Deltas are folded
    in as the dispatcher pushes them (`stream.sink`), so none wait in memory for the end."""
    c = _Collector(stream.num_choices, usage, want_logprobs)
    for d in stream.take():  # pushed before the sink was in place
        c.add(d)
    stream.sink = c.add
    try:
        while True:
            if c.failure is not None:
                raise c.failure
            if stream.failure is not None:
                raise stream.failure
            if stream.finished:
                return c.results
            await stream.wait()
    finally:
        stream.sink = None


class _VectorCollector:
    """An embedding request's sink: each input's one delta carries its vector."""

    __slots__ = ("failure", "vectors")

    def __init__(self, num_inputs: int) -> None:
        self.vectors: list[bytes | None] = [None] * num_inputs
        self.failure: ApiError | None = None

    def add(self, d: SeqDelta) -> None:
        if d.embedding is not None:
            self.vectors[d.index] = d.embedding
        elif d.finish_reason is not None and self.failure is None:
            self.failure = finish_failure(d.finish_reason, d.error, d.error_kind) or ApiError(
                500, "the embedding ended without a vector", type="server_error", code="embedding_error"
            )


async def collect_vectors(stream: RequestStream) -> list[bytes]:
    """Waits for every input's vector (in input order); raises the request's ApiError if one failed."""
    c = _VectorCollector(stream.num_choices)
    for d in stream.take():
        c.add(d)
    stream.sink = c.add
    try:
        while True:
            failure = c.failure or stream.failure
            if failure is not None:
                raise failure
            if stream.finished:
                return [v for v in c.vectors if v is not None]
            await stream.wait()
    finally:
        stream.sink = None
