"""`observability`: OpenTelemetry traces of requests, exported over OTLP/HTTP (http/observability/)."""

from __future__ import annotations

from dataclasses import dataclass

from rillet.core.config.errors import check


@dataclass(frozen=True)
class ObservabilityConfig:
    # Where spans go: an OTLP/HTTP protobuf traces endpoint (a collector's
    # http://host:4318/v1/traces). None = no tracing, and opentelemetry is never imported.
    otlp_endpoint: str | None = None
    # The spans' resource `service.name`.
    service_name: str = "rillet"

    def __post_init__(self) -> None:
        url = self.otlp_endpoint
        check(
            url is None or (url.startswith(("http://", "https://")) and len(url.split("//", 1)[1]) > 0),
            "observability.otlp_endpoint",
            "must be an http:// or https:// URL (e.g. http://127.0.0.1:4318/v1/traces) or null",
        )
        check(bool(self.service_name.strip()), "observability.service_name", "must not be empty")
