"""The OpenTelemetry side of request tracing: a tracer provider whose BatchSpanProcessor exports on
its own thread, and one SERVER span per request with the GenAI semantic conventions' attributes
(and vLLM's gen_ai.latency.* timings). Imported only when tracing is on (tracing.py)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from rillet.http.observability.facts import RequestFacts

_NS = 1_000_000_000


class OtelTracing:
    """Spans of finished requests, handed to `exporter` in batches by a background thread."""

    def __init__(self, service_name: str, exporter: SpanExporter) -> None:
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("rillet")
        self._propagator = TraceContextTextMapPropagator()

    def record(self, headers: Mapping[str, str], facts: RequestFacts) -> None:
        parent: Context | None = None
        if "traceparent" in headers:  # and its tracestate, which the propagator reads with it
            parent = self._propagator.extract(headers)
        # The span's times are wall-clock; the request's are monotonic: shift them by one offset.
        offset_ns = time.time_ns() - int(time.monotonic() * _NS)
        span = self._tracer.start_span(
            f"{facts.operation} {facts.model}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes(facts),
            start_time=offset_ns + int(facts.arrival * _NS),
        )
        outcome = facts.outcome
        if outcome.error_type is not None:
            span.set_attribute("error.type", outcome.error_type)
            span.set_status(Status(StatusCode.ERROR, outcome.message))
        span.end(end_time=offset_ns + int(facts.end * _NS))

    def flush(self, timeout_s: float = 10.0) -> bool:
        return self._provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self._provider.shutdown()


def otlp_tracing(endpoint: str, service_name: str) -> OtelTracing:
    """Exporting to an OTLP/HTTP protobuf endpoint (OTEL_EXPORTER_OTLP_HEADERS and the exporter's
    other environment variables apply, as for any OpenTelemetry SDK)."""
    return OtelTracing(service_name, OTLPSpanExporter(endpoint=endpoint))


def attributes(f: RequestFacts) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": f.operation,
        "gen_ai.request.model": f.model,
        "gen_ai.response.model": f.model,
        "gen_ai.response.id": f.response_id,
        "gen_ai.request.max_tokens": f.max_tokens,
        "gen_ai.request.temperature": f.temperature,
        "gen_ai.request.top_p": f.top_p,
        "gen_ai.request.n": f.n,
        "gen_ai.usage.input_tokens": f.input_tokens,
        "gen_ai.usage.output_tokens": f.output_tokens,
        "gen_ai.response.finish_reasons": f.finish_reasons,
        "gen_ai.latency.e2e": f.end - f.arrival,
        "http.request.method": f.method,
        "url.path": f.path,
        "http.response.status_code": f.outcome.status,
        "rillet.stream": f.stream,
    }
    if f.scheduled is not None:
        attrs["gen_ai.latency.time_in_queue"] = max(0.0, f.scheduled - f.arrival)
    if f.first_token is not None:
        attrs["gen_ai.latency.time_to_first_token"] = f.first_token - f.arrival
        if f.scheduled is not None:
            attrs["gen_ai.latency.time_in_model_prefill"] = max(0.0, f.first_token - f.scheduled)
        if f.last_token is not None:
            attrs["gen_ai.latency.time_in_model_decode"] = f.last_token - f.first_token
    return attrs
