"""Wires kv_events to an engine: the recorder on its block manager, the publisher thread beside it."""

from __future__ import annotations

import logging

from rillet.core.config import ConfigError, KVEventsConfig
from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.kv_events.hashing import BlockHasher
from rillet.core.engine.kv_events.publisher import ZmqEventPublisher, binds
from rillet.core.engine.kv_events.recorder import KVEventRecorder

log = logging.getLogger(__name__)


class KVEventStream:
    """The engine thread's handle: `pump()` between steps hands the step's events to the sender."""

    def __init__(self, recorder: KVEventRecorder, publisher: ZmqEventPublisher) -> None:
        self.recorder = recorder
        self.publisher = publisher

    def pump(self) -> None:
        if self.recorder.pending:
            self.publisher.publish(self.recorder.take())

    def close(self) -> None:
        self.pump()
        self.publisher.close()


def attach_kv_events(cfg: KVEventsConfig, blocks: BlockManager, model_name: str) -> KVEventStream | None:
    """None when kv_events is off. Attached before the pool registers any block, so the events
    describe the whole prefix cache from its first block."""
    if not cfg.enabled:
        return None
    assert blocks.num_cached == 0, "kv events attached to a pool that already caches blocks"
    try:
        publisher = ZmqEventPublisher(cfg)
    except ImportError as exc:
        raise ConfigError(
            "kv_events.enabled", f"needs pyzmq and msgpack: pip install 'rillet[kv-events]' ({exc})"
        ) from exc
    except Exception as exc:  # zmq.ZMQError: the address is taken, or malformed
        raise ConfigError("kv_events.endpoint", f"cannot open the sockets: {exc}") from exc
    hashed_as = cfg.model_in_topic() or model_name
    recorder = KVEventRecorder(blocks.block_size, BlockHasher(hashed_as, cfg.hash_seed))
    blocks.events = recorder
    log.info(
        "kv events: published %s %s, topic %r, block hashes rooted at model %r",
        "bound to" if binds(cfg.endpoint) else "to",
        cfg.endpoint,
        cfg.topic,
        hashed_as,
    )
    return KVEventStream(recorder, publisher)
