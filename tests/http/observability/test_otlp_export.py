"""Tracing end to end: `rillet serve`'s own exporter (observability.otlp_endpoint) posts OTLP/HTTP
protobuf to a receiver in this test, decoded with opentelemetry-proto as a collector decodes it;
and without the optional packages, tracing on is a config error at start-up naming the key."""

from __future__ import annotations

import asyncio
import gzip
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from http_helpers import post, serving, sse_events
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from repo import REPO
from rillet.core.config import ConfigError, load_config
from rillet.http.observability.facts import Outcome, RequestFacts
from rillet.http.observability.otel_tracing import otlp_tracing
from rillet.http.observability.span_sinks import bytes_poster
from rillet.http.observability.tracing import make_tracing

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


class Receiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1, on its own thread and loop."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.content_types: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        self._runner = web.AppRunner(app)
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> int:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def _export(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if raw[:2] == b"\x1f\x8b":  # gzip that aiohttp left compressed (it inflates what it can)
            raw = gzip.decompress(raw)
        self.content_types.append(request.content_type)
        self.headers.append(dict(request.headers))
        self.requests.append(ExportTraceServiceRequest.FromString(raw))
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _attrs(span: Span) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        array = [x.string_value for x in v.array_value.values]
        out[kv.key] = array if kind == "array_value" else getattr(v, kind)
    return out


def test_a_streamed_request_reaches_an_otlp_receiver_in_the_callers_trace(
    synthetic_engine: Any, receiver: Receiver
) -> None:
    endpoint = f"http://127.0.0.1:{receiver.port}/v1/traces"
    settings = (f"observability.otlp_endpoint={endpoint}", "observability.service_name=rillet-e2e")
    with serving(synthetic_engine, *settings) as srv:
        model = synthetic_engine.model_name
        messages = [{"role": "user", "content": "hi"}]
        body = {"model": model, "messages": messages, "max_tokens": 6, "stream": True}
        headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        resp = post(srv, "/v1/chat/completions", body, headers)
        events = [e for e in sse_events(resp.content) if e != "[DONE]"]
    # stopping the server exported what was queued
    assert receiver.content_types == ["application/x-protobuf"]
    (resource_spans,) = receiver.requests[0].resource_spans
    resource = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
    assert resource["service.name"] == "rillet-e2e"
    (span,) = [s for scope in resource_spans.scope_spans for s in scope.spans]
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID
    assert span.kind == Span.SPAN_KIND_SERVER and span.name == f"chat {model}"
    a = _attrs(span)
    assert a["gen_ai.response.id"] == events[0]["id"] and a["gen_ai.request.max_tokens"] == 6
    assert a["gen_ai.usage.output_tokens"] == 6 and a["gen_ai.response.finish_reasons"] == ["length"]
    assert 0 <= a["gen_ai.latency.time_to_first_token"] <= a["gen_ai.latency.e2e"]
    assert span.start_time_unix_nano <= span.end_time_unix_nano


def test_tracing_without_its_packages_is_a_config_error_naming_the_key_and_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    monkeypatch.delitem(sys.modules, "rillet.http.observability.otel_tracing", raising=False)
    cfg = load_config(None, ["observability.otlp_endpoint=http://127.0.0.1:4318/v1/traces"])
    with pytest.raises(ConfigError) as err:
        make_tracing(cfg.observability)
    assert err.value.key == "observability.otlp_endpoint" and "rillet[otel]" in str(err.value)
    assert make_tracing(load_config(None).observability) is None  # off: nothing imported, nothing needed


def test_rillet_serve_exits_2_at_start_up_when_tracing_lacks_its_packages() -> None:
    code = (
        "import sys; sys.modules['opentelemetry.sdk.trace'] = None\n"
        "from rillet.http.cli import main\n"
        "sys.exit(main(['serve', '--port', '0', '--set', 'model.kind=synthetic', '--set', "
        "'observability.otlp_endpoint=http://127.0.0.1:4318/v1/traces']))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "observability.otlp_endpoint" in r.stderr and "rillet[otel]" in r.stderr
    assert "listening" not in r.stderr  # refused before the socket opened


def test_the_exporters_own_settings_apply_to_rillets_bytes(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OTLP exporter's environment (headers, compression) applies to the protobuf rillet writes
    (posted through the exporter's HTTP client: with the SDK installed here, not its encoder)."""
    assert bytes_poster(OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")) is not None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "api-key=secret")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    tracing = otlp_tracing(f"http://127.0.0.1:{receiver.port}/v1/traces", "svc")
    now = time.monotonic()
    facts = RequestFacts(
        "chat", "m", "chatcmpl-1", "POST", "/v1/chat/completions", False, 1, 8, 1.0, 1.0, 3, 8,
        ("length",), now, now, now, now, now, Outcome(200),
    )  # fmt: skip
    tracing.record({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}, facts)
    tracing.shutdown()
    (headers,) = receiver.headers
    assert headers["api-key"] == "secret" and headers["Content-Encoding"] == "gzip"
    (span,) = receiver.requests[0].resource_spans[0].scope_spans[0].spans
    assert span.trace_id.hex() == TRACE_ID and span.name == "chat m"
