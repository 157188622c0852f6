"""Where a batch of span records goes on the export thread: straight to OTLP/HTTP as protobuf bytes
through the SDK exporter's own HTTP client (its headers, compression, TLS and retries), or, for any
other SpanExporter (the tests' in-memory one, an SDK without that client), as the SDK's ReadableSpans."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from rillet.http.observability.otlp_wire import SpanEncoder, SpanRecord

_logger = logging.getLogger(__name__)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)

Sink = Callable[[Sequence[SpanRecord]], None]


def make_sink(exporter: SpanExporter, resource: Resource, scope: str, max_value_len: int | None) -> Sink:
    post = bytes_poster(exporter)
    if post is None:
        return lambda batch: _export_readable(exporter, resource, scope, batch, max_value_len)
    encoder = SpanEncoder(resource.attributes, resource.schema_url, scope)

    def send(batch: Sequence[SpanRecord]) -> None:
        if max_value_len is not None:
            batch = [r._replace(attributes=_truncated(r.attributes, max_value_len)) for r in batch]
        post(encoder.request(batch))

    return send


def bytes_poster(exporter: SpanExporter) -> Callable[[bytes], None] | None:
    """The OTLP/HTTP exporter's client (opentelemetry-exporter-otlp-proto-http 1.4x's `_client`:
    not public, so looked for, and the SDK's own path taken where it is missing)."""
    export = getattr(getattr(exporter, "_client", None), "export", None)
    if not isinstance(exporter, OTLPSpanExporter) or not callable(export):
        return None

    def post(data: bytes) -> None:
        result = export(data)
        if not getattr(result, "success", False):
            _logger.warning("span export failed: %s", getattr(result, "error", result))

    return post


def _export_readable(
    exporter: SpanExporter, resource: Resource, scope: str, batch: Sequence[SpanRecord], max_len: int | None
) -> None:
    instrumentation = InstrumentationScope(scope)
    spans = [readable_span(r, resource, instrumentation, max_len) for r in batch]
    exporter.export(spans)


def readable_span(
    r: SpanRecord, resource: Resource, scope: InstrumentationScope, max_len: int | None = None
) -> ReadableSpan:
    """The span the SDK's tracer would have ended with the same facts."""
    state = r.trace_state
    context = SpanContext(r.trace_id, r.span_id, is_remote=False, trace_flags=_SAMPLED, trace_state=state)
    status = Status(StatusCode.UNSET) if r.error is None else Status(StatusCode.ERROR, r.error or None)
    attrs = dict(r.attributes) if max_len is None else _truncated(r.attributes, max_len)
    return ReadableSpan(
        name=r.name,
        context=context,
        parent=r.parent,
        resource=resource,
        attributes=attrs,
        kind=SpanKind.SERVER,
        status=status,
        start_time=r.start_ns,
        end_time=r.end_ns,
        instrumentation_scope=scope,
    )


def _truncated(attrs: Mapping[str, Any], max_len: int) -> dict[str, Any]:
    """OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT, as the SDK applies it: strings, and those in sequences."""

    def cut(v: Any) -> Any:
        if isinstance(v, str):
            return v[:max_len]
        if isinstance(v, tuple):
            return tuple(cut(x) for x in v)
        return v

    return {k: cut(v) for k, v in attrs.items()}
