"""The one configuration: frozen dataclasses, loaded from YAML, overridden from the CLI, validated once.

Every tunable of rillet lives here, one section per YAML key (model.py, engine.py, serving.py;
root.py holds them together). `load_config(path, overrides)` (loading.py) is the only way a config
is built from outside; each section validates itself in `__post_init__` and raises `ConfigError`
naming the dotted key and what is allowed. This package imports no torch: the HTTP layer reads it.
"""

from rillet.core.config.engine import (
    AttentionBackendName,
    AttentionConfig,
    CompileMode,
    EngineConfig,
    FlashinferPrefillKernels,
    GraphConfig,
    PrefillBackendName,
    SchedulerConfig,
    StructuredConfig,
)
from rillet.core.config.errors import ConfigError
from rillet.core.config.kv_events import KVEventsConfig
from rillet.core.config.loading import config_from_dict, config_to_dict, load_config
from rillet.core.config.lora import LoraConfig
from rillet.core.config.model import CacheConfig, Device, DType, ModelConfig, ModelKind
from rillet.core.config.observability import ObservabilityConfig
from rillet.core.config.responses import ResponsesConfig
from rillet.core.config.root import RilletConfig
from rillet.core.config.serving import (
    LoggingConfig,
    LogLevel,
    OverCapacity,
    ParallelConfig,
    ServerConfig,
    StreamConfig,
)
from rillet.core.config.speculative import SpecMethod, SpeculativeConfig

__all__ = [
    "AttentionBackendName",
    "AttentionConfig",
    "CacheConfig",
    "CompileMode",
    "ConfigError",
    "DType",
    "Device",
    "EngineConfig",
    "FlashinferPrefillKernels",
    "GraphConfig",
    "KVEventsConfig",
    "LogLevel",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "ModelKind",
    "ObservabilityConfig",
    "OverCapacity",
    "ParallelConfig",
    "PrefillBackendName",
    "ResponsesConfig",
    "RilletConfig",
    "SchedulerConfig",
    "ServerConfig",
    "SpecMethod",
    "SpeculativeConfig",
    "StreamConfig",
    "StructuredConfig",
    "config_from_dict",
    "config_to_dict",
    "load_config",
]
