"""`responses`: the OpenAI Responses API's store of finished responses (`store`, `previous_response_id`)."""

from __future__ import annotations

from dataclasses import dataclass

from rillet.core.config.errors import check


@dataclass(frozen=True)
class ResponsesConfig:
    # Responses kept in memory for `previous_response_id` and GET/DELETE /v1/responses/{id}; the
    # oldest is dropped past this many (0 = keep none: every `store: true` is then forgotten at once).
    store_size: int = 1024
    # Seconds a stored response lives (> 0); an expired id is a 404 like an unknown one.
    store_ttl_s: float = 3600.0

    def __post_init__(self) -> None:
        check(self.store_size >= 0, "responses.store_size", "must be >= 0")
        check(self.store_ttl_s > 0, "responses.store_ttl_s", "must be > 0")
