"""OTLP/protobuf bytes (an ExportTraceServiceRequest) for a batch of request spans, written straight
from each span's plain record. The SDK's encoder builds a protobuf object per attribute and value
(~100 us a span); here the fixed parts (the resource, the scope, each attribute key) are encoded once
and a span is a join of byte strings. The message is field for field what the SDK's encoder sends
for the same span (tests/http/observability/test_otlp_wire.py decodes both and compares)."""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from opentelemetry.trace import SpanContext, TraceState

_logger = logging.getLogger(__name__)

_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")
_SMALL = tuple(bytes((i,)) for i in range(128))  # one-byte varints
_TRUE, _FALSE = b"\x10\x01", b"\x10\x00"  # AnyValue.bool_value
_UINT64 = (1 << 64) - 1
# Span.flags (fixed32, field 16): the SDK's HAS_IS_REMOTE bit, plus IS_REMOTE for a remote parent
_FLAGS_LOCAL = b"\x85\x01" + struct.pack("<I", 0x100)
_FLAGS_REMOTE = b"\x85\x01" + struct.pack("<I", 0x300)
_KIND_SERVER = b"\x30\x02"  # Span.kind = SPAN_KIND_SERVER


class SpanRecord(NamedTuple):
    """One finished span, as the event loop hands it over (nothing encoded yet)."""

    name: str
    trace_id: int
    span_id: int
    parent: SpanContext | None  # the caller's span; None for a root
    trace_state: TraceState | None
    attributes: Mapping[str, Any]
    start_ns: int  # Unix epoch nanoseconds
    end_ns: int
    error: str | None  # None: status UNSET; else status ERROR (with this description, if not "")


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    return tag + _varint(len(payload)) + payload


def any_value(v: Any) -> bytes:
    """An AnyValue's fields, for the value types the SDK's encoder takes (bool before int)."""
    if isinstance(v, str):
        return _field(b"\x0a", v.encode())
    if isinstance(v, bool):
        return _TRUE if v else _FALSE
    if isinstance(v, int):
        return b"\x18" + _varint(v & _UINT64)
    if isinstance(v, float):
        return b"\x21" + _DOUBLE.pack(v)
    if v is None:
        return b""
    if isinstance(v, bytes):
        return _field(b"\x3a", v)
    if isinstance(v, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", any_value(x)) for x in v))
    if isinstance(v, Mapping):
        kvs = b"".join(_field(b"\x0a", key_value(str(k), x)) for k, x in v.items())
        return _field(b"\x32", kvs)
    raise TypeError(type(v).__qualname__)


def key_value(key: str, value: Any) -> bytes:
    return _field(b"\x0a", key.encode()) + _field(b"\x12", any_value(value))


class SpanEncoder:
    """Encodes batches of one resource's and one instrumentation scope's spans."""

    def __init__(self, resource: Mapping[str, Any], resource_schema_url: str, scope_name: str) -> None:
        attrs = b"".join(_field(b"\x0a", key_value(k, v)) for k, v in resource.items())
        self._resource = _field(b"\x0a", attrs)  # ResourceSpans.resource
        self._resource_schema = _field(b"\x1a", resource_schema_url.encode()) if resource_schema_url else b""
        self._scope = _field(b"\x0a", _field(b"\x0a", scope_name.encode()))  # ScopeSpans.scope
        self._keys: dict[str, bytes] = {}  # attribute key -> its KeyValue.key field

    def request(self, spans: Sequence[SpanRecord]) -> bytes:
        """The ExportTraceServiceRequest's bytes."""
        scope_spans = self._scope + b"".join([_field(b"\x12", self.span(s)) for s in spans])
        resource_spans = self._resource + _field(b"\x12", scope_spans) + self._resource_schema
        return _field(b"\x0a", resource_spans)

    def span(self, s: SpanRecord) -> bytes:
        parts = [b"\x0a\x10", s.trace_id.to_bytes(16, "big"), b"\x12\x08", s.span_id.to_bytes(8, "big")]
        if s.trace_state:
            parts.append(_field(b"\x1a", ",".join(f"{k}={v}" for k, v in s.trace_state.items()).encode()))
        if s.parent is not None:
            parts += (b"\x22\x08", s.parent.span_id.to_bytes(8, "big"))
        parts += (_field(b"\x2a", s.name.encode()), _KIND_SERVER)
        parts += (b"\x39", _FIXED64.pack(s.start_ns), b"\x41", _FIXED64.pack(s.end_ns))
        parts += self._attributes(s.attributes)
        if s.error is None:
            parts.append(b"\x7a\x00")  # Status {} (UNSET)
        else:
            message = _field(b"\x12", s.error.encode()) if s.error else b""
            parts.append(_field(b"\x7a", message + b"\x18\x02"))  # Status {message, code: ERROR}
        parts.append(_FLAGS_REMOTE if s.parent is not None and s.parent.is_remote else _FLAGS_LOCAL)
        return b"".join(parts)

    def _attributes(self, attrs: Mapping[str, Any]) -> list[bytes]:
        keys = self._keys
        out: list[bytes] = []
        for k, v in attrs.items():
            key = keys.get(k)
            if key is None:
                key = keys[k] = _field(b"\x0a", k.encode())
            try:
                kv = key + _field(b"\x12", any_value(v))
            except (TypeError, UnicodeError):  # as the SDK's encoder: log it, keep the other attributes
                _logger.exception("span attribute %s not encodable", k)
                continue
            out += (b"\x4a", _varint(len(kv)), kv)
        return out
