"""Request spans (observability.otlp_endpoint): one SERVER span per generation request, with the GenAI
semantic conventions' attributes, continuing the caller's W3C trace context, through the SDK's real
BatchSpanProcessor into its InMemorySpanExporter. The real engine (synthetic model) serves the
happy paths, so the engine's timings come through its scheduler; the fake engine the failures."""

from __future__ import annotations

import http.client
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from fake_engine import FAIL_MARKER, FakeEngine
from http_helpers import post, serving, sse_events, wait_for
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from rillet.http.background import BackgroundServer
from rillet.http.observability.otel_tracing import OtelTracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
CALLER = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": "vendor=abc,other=1"}


class Traced:
    """A server whose state records spans into memory."""

    def __init__(self, srv: BackgroundServer) -> None:
        self.srv = srv
        self.exporter = InMemorySpanExporter()
        self.tracing = OtelTracing("rillet-test", self.exporter)
        srv.state.tracing = self.tracing

    def spans(self, count: int) -> list[ReadableSpan]:
        """The first `count` spans ended since the last call (a streamed request's span is recorded
        just after its last bytes leave, so the client can be ahead of it)."""
        deadline = time.monotonic() + 10
        while True:
            self.tracing.flush()
            got = list(self.exporter.get_finished_spans())
            if len(got) >= count or time.monotonic() > deadline:
                self.exporter.clear()
                assert len(got) == count, [s.name for s in got]
                return got
            time.sleep(0.01)


@pytest.fixture(scope="module")
def traced(synthetic_engine: Any) -> Iterator[Traced]:
    with serving(synthetic_engine) as srv:
        yield Traced(srv)


def _continues_caller(span: ReadableSpan) -> None:
    assert span.context is not None and span.parent is not None
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == PARENT_ID and span.parent.is_remote
    assert dict(span.context.trace_state) == {"vendor": "abc", "other": "1"}


def _timings_in_order(a: Any) -> None:
    queue, ttft = a["gen_ai.latency.time_in_queue"], a["gen_ai.latency.time_to_first_token"]
    assert 0 <= queue <= ttft <= a["gen_ai.latency.e2e"]
    assert a["gen_ai.latency.time_in_model_prefill"] <= ttft
    assert 0 <= a["gen_ai.latency.time_in_model_decode"] <= a["gen_ai.latency.e2e"]


def test_a_chat_request_is_one_server_span_continuing_the_callers_trace(traced: Traced) -> None:
    model = traced.srv.state.limits.model_name  # type: ignore[union-attr]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
    }
    resp = post(traced.srv, "/v1/chat/completions", body, CALLER)
    assert resp.status_code == 200
    answer = resp.json()
    (span,) = traced.spans(1)
    assert span.name == f"chat {model}" and span.kind is SpanKind.SERVER
    assert span.status.status_code is StatusCode.UNSET
    _continues_caller(span)
    a = span.attributes
    assert a is not None
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == model
    assert a["gen_ai.request.max_tokens"] == 7
    assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.request.top_p"] == 0.9
    assert a["gen_ai.response.id"] == answer["id"]
    assert a["gen_ai.usage.input_tokens"] == answer["usage"]["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == answer["usage"]["completion_tokens"]
    assert a["gen_ai.response.finish_reasons"] == (answer["choices"][0]["finish_reason"],)
    assert a["http.response.status_code"] == 200 and a["url.path"] == "/v1/chat/completions"
    assert a["rillet.stream"] is False
    _timings_in_order(a)
    assert span.start_time is not None and span.end_time is not None and span.start_time <= span.end_time


def test_a_streamed_completion_continues_the_callers_trace(traced: Traced) -> None:
    model = traced.srv.state.limits.model_name  # type: ignore[union-attr]
    body = {"model": model, "prompt": "count", "max_tokens": 5, "stream": True, "n": 2}
    resp = post(traced.srv, "/v1/completions", body, CALLER)
    events = [e for e in sse_events(resp.content) if e != "[DONE]"]
    (span,) = traced.spans(1)
    assert span.name == f"text_completion {model}"
    _continues_caller(span)
    a = span.attributes
    assert a is not None
    assert a["gen_ai.response.id"] == events[0]["id"] and a["gen_ai.request.n"] == 2
    assert a["gen_ai.usage.output_tokens"] == 10 and a["rillet.stream"] is True
    assert a["gen_ai.response.finish_reasons"] == ("length", "length")
    _timings_in_order(a)


def test_responses_and_messages_are_traced_too_and_without_a_caller_a_span_is_a_root(traced: Traced) -> None:
    model = traced.srv.state.limits.model_name  # type: ignore[union-attr]
    responses = {"model": model, "input": "hi", "max_output_tokens": 4, "stream": True}
    streamed = re.search(rb'"id":"(resp_[0-9a-f]+)"', post(traced.srv, "/v1/responses", responses).content)
    assert streamed is not None
    messages = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    message = post(traced.srv, "/v1/messages", messages).json()
    spans = {s.attributes["url.path"]: s for s in traced.spans(2) if s.attributes}  # type: ignore[index]
    ids = {p: s.attributes["gen_ai.response.id"] for p, s in spans.items() if s.attributes}
    assert ids["/v1/messages"] == message["id"]
    assert ids["/v1/responses"] == streamed[1].decode()
    for span in spans.values():
        assert span.parent is None and span.name == f"chat {model}"
        assert span.attributes is not None and span.attributes["gen_ai.usage.output_tokens"] == 4


def test_the_callers_decision_not_to_sample_is_kept(traced: Traced) -> None:
    model = traced.srv.state.limits.model_name  # type: ignore[union-attr]
    unsampled = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00"}
    body = {"model": model, "prompt": "x", "max_tokens": 2}
    assert post(traced.srv, "/v1/completions", body, unsampled).status_code == 200
    assert post(traced.srv, "/v1/completions", body, CALLER).status_code == 200
    (span,) = traced.spans(1)  # only the sampled one
    _continues_caller(span)


def _failed(span: ReadableSpan, error_type: str, status: int) -> None:
    assert span.status.status_code is StatusCode.ERROR and span.status.description
    assert span.attributes is not None
    assert span.attributes["error.type"] == error_type
    assert span.attributes["http.response.status_code"] == status


def test_failures_set_the_error_status(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake(step_ms=5)
    with serving(engine, "server.request_timeout_s=0.2") as srv:
        t = Traced(srv)
        failing = {"model": "fake-model", "prompt": FAIL_MARKER, "max_tokens": 50}
        assert post(srv, "/v1/completions", {**failing, "stream": True}, CALLER).status_code == 200
        (span,) = t.spans(1)
        _failed(span, "generation_error", 200)  # the stream had begun: its error is an event
        _continues_caller(span)
        assert span.attributes is not None and span.attributes["gen_ai.response.finish_reasons"] == ("error",)
        assert post(srv, "/v1/completions", failing).status_code == 500
        _failed(t.spans(1)[0], "generation_error", 500)
        # 5 ms a step: 900 tokens outlast the 0.2 s deadline
        slow = {"model": "fake-model", "prompt": "x", "max_tokens": 900, "ignore_eos": True}
        assert post(srv, "/v1/completions", slow).status_code == 504
        _failed(t.spans(1)[0], "deadline_exceeded", 504)


def test_a_client_that_goes_away_ends_its_span_as_cancelled(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake(step_ms=20)  # 900 tokens: 18 s, far past the client's leaving
    with serving(engine) as srv:
        t = Traced(srv)
        body = {"model": "fake-model", "prompt": "x", "max_tokens": 900, "ignore_eos": True}
        conn = http.client.HTTPConnection(srv.host, srv.port, timeout=30)
        conn.request("POST", "/v1/completions", body=orjson.dumps(body), headers=CALLER)
        deadline = time.monotonic() + 10
        while engine.stats().running == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        conn.close()  # before any answer: the server cancels the handler
        (span,) = t.spans(1)
        _failed(span, "cancelled", 499)
        _continues_caller(span)


def test_a_request_the_engine_refuses_has_its_span(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake("scheduler.max_waiting=1")
    with serving(engine) as srv:
        t = Traced(srv)
        engine.steps_allowed.clear()  # the first request runs, held; the second waits in the inbox
        body = {"model": "fake-model", "prompt": "x", "max_tokens": 3}
        held = [threading.Thread(target=post, args=(srv, "/v1/completions", body)) for _ in range(2)]
        for i, th in enumerate(held, 1):
            th.start()
            wait_for(lambda i=i: engine.stats().waiting + engine.stats().running == i)
        assert post(srv, "/v1/completions", body, CALLER).status_code == 429
        (span,) = t.spans(1)
        _failed(span, "queue_full", 429)
        _continues_caller(span)
        engine.steps_allowed.set()
        for th in held:
            th.join(10)
        assert len(t.spans(2)) == 2
