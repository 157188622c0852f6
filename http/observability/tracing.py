"""Whether requests are traced: `make_tracing` builds the exporter when `observability.otlp_endpoint`
is set, importing opentelemetry only then (the optional extra `rillet[otel]`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from rillet.core.config import ConfigError
from rillet.core.config.observability import ObservabilityConfig
from rillet.http.observability.facts import RequestFacts

EXTRA_HINT = "pip install 'rillet[otel]' (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)"


class Tracing(Protocol):
    def record(self, headers: Mapping[str, str], facts: RequestFacts) -> None:
        """One finished request's span, continuing the trace named by its `traceparent` header.
        On the event loop: must not block (the span is queued for a background exporter)."""
        ...

    def shutdown(self) -> None:
        """Exports what is queued and stops the exporter (blocking: call it off the loop)."""
        ...


def make_tracing(cfg: ObservabilityConfig) -> Tracing | None:
    """None when tracing is off; raises ConfigError when it is on and the packages are missing."""
    if cfg.otlp_endpoint is None:
        return None
    try:
        from rillet.http.observability.otel_tracing import otlp_tracing
    except ImportError as exc:
        missing = exc.name or "opentelemetry"
        raise ConfigError(
            "observability.otlp_endpoint",
            f"tracing needs the optional OpenTelemetry packages ({missing} is not installed): {EXTRA_HINT}",
        ) from exc
    return otlp_tracing(cfg.otlp_endpoint, cfg.service_name)
