"""`kv_events`: KV-cache events for llm-d's precise prefix-cache scorer, in vLLM's wire format
(core/engine/kv_events/; docs/kv-events.md). The keys mirror vLLM's KVEventsConfig."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rillet.core.config.errors import check

_SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass(frozen=True)
class KVEventsConfig:
    # Publish block stored / removed / all-cleared events (needs cache.prefix_caching, and the
    # kv-events extra: pyzmq, msgpack). Off: the block manager does no per-block work for them.
    enabled: bool = False
    # The transport; vLLM's `publisher` key (only zmq here).
    publisher: Literal["zmq"] = "zmq"
    # The PUB socket: bound when it has a wildcard (tcp://*:5557) or is ipc:// / inproc://,
    # else connected to (tcp://indexer:5557, where llm-d's indexer binds).
    endpoint: str = "tcp://*:5557"
    # A ROUTER socket that resends buffered batches from a requested sequence number; null: none.
    replay_endpoint: str | None = None
    # The first frame of every message. llm-d reads "kv@<pod-id>@<model-name>" from it; its
    # model name is also the one the published block hashes are rooted at.
    topic: str = ""
    # Batches kept for replay.
    buffer_steps: int = 10_000
    # The PUB socket's high-water mark (messages held for slow subscribers).
    hwm: int = 100_000
    # Batches waiting for the sender thread; past it a batch is dropped (and counted).
    max_queue_size: int = 100_000
    # llm-d's tokenProcessorConfig.hashSeed: the seed of the block hash chain (vLLM's
    # PYTHONHASHSEED in an llm-d deployment); both sides must agree.
    hash_seed: str = ""

    def __post_init__(self) -> None:
        check(
            self.endpoint.startswith(_SCHEMES),
            "kv_events.endpoint",
            "must be a tcp://, ipc:// or inproc:// address",
        )
        check(
            self.replay_endpoint is None or self.replay_endpoint.startswith(_SCHEMES),
            "kv_events.replay_endpoint",
            "must be a tcp://, ipc:// or inproc:// address, or null",
        )
        check(self.buffer_steps >= 0, "kv_events.buffer_steps", "must be >= 0")
        check(self.hwm >= 0, "kv_events.hwm", "must be >= 0 (0: no limit)")
        check(self.max_queue_size >= 1, "kv_events.max_queue_size", "must be >= 1")

    def model_in_topic(self) -> str | None:
        """The model name of an llm-d topic kv@<pod-id>@<model-name>, else None."""
        parts = self.topic.split("@")
        return parts[2] if len(parts) == 3 and parts[2] else None
