"""The OpenTelemetry side of request tracing: one SERVER span per request with the GenAI semantic
conventions' attributes (and vLLM's gen_ai.latency.* timings), continuing the caller's W3C trace
context and sampled by the SDK's sampler (OTEL_TRACES_SAMPLER). The event loop only decides and
queues a plain record (span_batcher.py); the span is built and encoded on the export thread
(span_sinks.py, otlp_wire.py). Imported only when tracing is on (tracing.py)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import SpanKind, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from rillet.http.observability.facts import RequestFacts
from rillet.http.observability.otlp_wire import SpanRecord
from rillet.http.observability.span_batcher import BatchTerms, SpanBatcher
from rillet.http.observability.span_sinks import make_sink

_NS = 1_000_000_000
SCOPE = "rillet"


class OtelTracing:
    """Spans of finished requests, handed to `exporter` in batches by a background thread."""

    def __init__(self, service_name: str, exporter: SpanExporter, terms: BatchTerms | None = None) -> None:
        # The provider only for what the SDK reads from the environment: the resource
        # (OTEL_RESOURCE_ATTRIBUTES), the sampler (OTEL_TRACES_SAMPLER) and the id generator.
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self._sampler = provider.sampler
        self._ids = provider.id_generator
        self._propagator = TraceContextTextMapPropagator()
        self._exporter = exporter
        sink = make_sink(exporter, provider.resource, SCOPE, SpanLimits().max_span_attribute_length)
        self._batcher: SpanBatcher[SpanRecord] = SpanBatcher(sink, terms or BatchTerms.from_env())

    def record(self, headers: Mapping[str, str], facts: RequestFacts) -> None:
        """The SDK tracer's start_span and end, less the Span object: the same parent, ids, sampling
        decision and attributes, queued as a tuple."""
        context: Context | None = None
        if "traceparent" in headers:  # and its tracestate, which the propagator reads with it
            context = self._propagator.extract(headers)
        parent = get_current_span(context).get_span_context()
        valid = parent.is_valid
        trace_id = parent.trace_id if valid else self._ids.generate_trace_id()
        name = f"{facts.operation} {facts.model}"
        sampling = self._sampler.should_sample(context, trace_id, name, SpanKind.SERVER, attributes(facts))
        span_id = self._ids.generate_span_id()
        if not sampling.decision.is_sampled():
            return
        attrs = dict(sampling.attributes)
        outcome = facts.outcome
        error = None
        if outcome.error_type is not None:
            attrs["error.type"] = outcome.error_type
            error = outcome.message or ""
        # The span's times are wall-clock; the request's are monotonic: shift them by one offset.
        offset_ns = time.time_ns() - int(time.monotonic() * _NS)
        start, end = offset_ns + int(facts.arrival * _NS), offset_ns + int(facts.end * _NS)
        parent_ctx = parent if valid else None
        state = sampling.trace_state
        self._batcher.put(SpanRecord(name, trace_id, span_id, parent_ctx, state, attrs, start, end, error))

    def flush(self, timeout_s: float = 10.0) -> bool:
        return self._batcher.flush(timeout_s)

    def shutdown(self) -> None:
        self._batcher.shutdown()
        self._exporter.shutdown()


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
