"""Request tracing: one OpenTelemetry span per generation request, exported over OTLP/HTTP.

facts.py gathers what a finished request's span says (plain data, no opentelemetry); tracing.py
decides at start-up whether tracing is on (`observability.otlp_endpoint`) and only then imports
otel_tracing.py, the one module that imports opentelemetry. Spans are built on the event loop when
a request ends, from the timings its stream already kept; a BatchSpanProcessor's own thread
exports them, so neither the loop nor the engine thread waits on a collector.
"""
