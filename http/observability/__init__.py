"""Request tracing: one OpenTelemetry span per generation request, exported over OTLP/HTTP.

facts.py gathers what a finished request's span says (plain data, no opentelemetry); tracing.py
decides at start-up whether tracing is on (`observability.otlp_endpoint`) and only then imports
otel_tracing.py and the modules it uses, the only ones that import opentelemetry. When a request
ends the event loop makes the SDK's decisions (parent, sampling, ids) and queues a plain record
(otel_tracing.py); span_batcher.py's thread hands batches to span_sinks.py, which writes their
OTLP protobuf (otlp_wire.py) and posts it, so neither the loop nor the engine thread waits on a
collector or pays for a span object or its encoding.
"""
