"""The whole configuration: one frozen dataclass per YAML section."""

from __future__ import annotations

from dataclasses import dataclass, field

from rillet.core.config.engine import (
    AttentionConfig,
    EngineConfig,
    GraphConfig,
    SchedulerConfig,
    StructuredConfig,
)
from rillet.core.config.errors import check
from rillet.core.config.kv_events import KVEventsConfig
from rillet.core.config.lora import LoraConfig
from rillet.core.config.model import CacheConfig, ModelConfig
from rillet.core.config.observability import ObservabilityConfig
from rillet.core.config.responses import ResponsesConfig
from rillet.core.config.serving import LoggingConfig, ParallelConfig, ServerConfig, StreamConfig
from rillet.core.config.speculative import SpeculativeConfig


@dataclass(frozen=True)
class RilletConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    graphs: GraphConfig = field(default_factory=GraphConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    structured: StructuredConfig = field(default_factory=StructuredConfig)
    responses: ResponsesConfig = field(default_factory=ResponsesConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)

    def __post_init__(self) -> None:
        check(
            not self.kv_events.enabled or self.cache.prefix_caching,
            "kv_events.enabled",
            "needs cache.prefix_caching: true (the events describe the prefix cache)",
        )
