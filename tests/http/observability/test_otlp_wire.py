"""The spans rillet sends are the SDK's spans: for the same requests, the SDK's own tracer (start_span,
end, BatchSpanProcessor; what rillet used before) and rillet's record-and-encode path give the same
ExportTraceServiceRequest, decoded with opentelemetry-proto (a root span's random ids and the
clock aside), and rillet's bytes for the SDK's spans are the SDK encoder's bytes exactly."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import pytest
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from rillet.http.observability.facts import Outcome, RequestFacts
from rillet.http.observability.otel_tracing import OtelTracing, attributes
from rillet.http.observability.otlp_wire import SpanEncoder, SpanRecord
from rillet.http.observability.span_batcher import BatchTerms

CALLER = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "vendor=abc,other=1",
}
UNSAMPLED = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}
_NS = 1_000_000_000


def _facts(**changes: object) -> RequestFacts:
    now = time.monotonic()
    base = RequestFacts(
        operation="chat",
        model="synthetic",
        response_id="chatcmpl-0123456789abcdef",
        method="POST",
        path="/v1/chat/completions",
        stream=False,
        n=1,
        max_tokens=64,
        temperature=0.7,
        top_p=1.0,
        input_tokens=12,
        output_tokens=64,
        finish_reasons=("length",),
        arrival=now,
        scheduled=now + 0.001,
        first_token=now + 0.01,
        last_token=now + 0.3,
        end=now + 0.31,
        outcome=Outcome(200),
    )
    return RequestFacts(**{**base.__dict__, **changes})  # type: ignore[arg-type]


CASES: list[tuple[Mapping[str, str], RequestFacts]] = [
    (CALLER, _facts()),
    ({}, _facts(operation="text_completion", stream=True, n=2, finish_reasons=("stop", "error"))),
    (
        CALLER,
        _facts(outcome=Outcome(200, "generation_error", "the engine failed"), finish_reasons=("error",)),
    ),
    (  # refused before any token: no engine timings, no finish reasons, an integer temperature
        {},
        _facts(
            scheduled=None,
            first_token=None,
            last_token=None,
            finish_reasons=(),
            output_tokens=0,
            temperature=1,
            model="modèle-ü",
            outcome=Outcome(429, "queue_full", None),
        ),
    ),
    (UNSAMPLED, _facts()),  # no span on either side
]


def _sdk_reference(cases: Sequence[tuple[Mapping[str, str], RequestFacts]]) -> list[ReadableSpan]:
    """rillet's spans as the SDK's tracer made them before (start_span with the attributes, end)."""
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("rillet")
    for headers, f in cases:
        parent: Context | None = None
        if "traceparent" in headers:
            parent = TraceContextTextMapPropagator().extract(headers)
        offset = time.time_ns() - int(time.monotonic() * _NS)
        span = tracer.start_span(
            f"{f.operation} {f.model}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes(f),
            start_time=offset + int(f.arrival * _NS),
        )
        if f.outcome.error_type is not None:
            span.set_attribute("error.type", f.outcome.error_type)
            span.set_status(Status(StatusCode.ERROR, f.outcome.message))
        span.end(end_time=offset + int(f.end * _NS))
    return list(memory.get_finished_spans())


def _comparable(raw: bytes) -> ExportTraceServiceRequest:
    msg = ExportTraceServiceRequest.FromString(raw)
    for scope in msg.resource_spans[0].scope_spans:
        for s in scope.spans:
            s.start_time_unix_nano = s.end_time_unix_nano = 0
            s.span_id = b"\0" * 8  # random on both sides
            if not s.parent_span_id:
                s.trace_id = b"\0" * 16  # a root's trace id is random too
    return msg


def test_rillets_path_sends_what_the_sdks_tracer_sent() -> None:
    memory = InMemorySpanExporter()
    tracing = OtelTracing("svc", memory, BatchTerms(delay_s=60))
    for headers, facts in CASES:
        tracing.record(headers, facts)
    assert tracing.flush()
    ours, theirs = list(memory.get_finished_spans()), _sdk_reference(CASES)
    tracing.shutdown()
    assert len(ours) == len(theirs) == len(CASES) - 1
    expected = _comparable(encode_spans(theirs).SerializeToString())
    assert _comparable(encode_spans(ours).SerializeToString()) == expected
    # and the bytes rillet writes for them
    resource = ours[0].resource
    encoder = SpanEncoder(resource.attributes, resource.schema_url, "rillet")
    assert _comparable(encoder.request([_record(s) for s in ours])) == expected


@pytest.mark.parametrize(
    "value", [-3, 2**63 - 1, 0.0, -1.5e300, True, False, "", b"\x00\xff", (1, -2), (0.5,), (True,), ()]
)
def test_every_attribute_type_is_encoded_as_the_sdk_encodes_it(value: object) -> None:
    (span,) = _sdk_reference([({}, _facts(response_id=value))])
    encoder = SpanEncoder(span.resource.attributes, span.resource.schema_url, "rillet")
    assert encoder.request([_record(span)]) == encode_spans([span]).SerializeToString()


def _record(s: ReadableSpan) -> SpanRecord:
    assert s.context is not None and s.start_time is not None and s.end_time is not None
    error = None if s.status.status_code is StatusCode.UNSET else (s.status.description or "")
    attrs = dict(s.attributes or {})
    return SpanRecord(
        s.name,
        s.context.trace_id,
        s.context.span_id,
        s.parent,
        s.context.trace_state,
        attrs,
        s.start_time,
        s.end_time,
        error,
    )
