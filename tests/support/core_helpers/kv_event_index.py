"""A KV-events subscriber for tests: rebuilds a server's prefix-cache index from its events alone,
the way llm-d's indexer reads them (llm-d-router pkg/kvevents: positional msgpack arrays, a
BlockStored's keys recomputed from its tokens chained from its parent's key)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
from rillet.core.engine.kv_events.hashing import BlockHasher


@dataclass
class EventIndex:
    hasher: BlockHasher
    hashes: set[int] = field(default_factory=set)
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    orphans: int = 0  # stores whose parent the index did not hold (llm-d skips those)
    # images: a block an image overlaps is keyed on the image too, which its tokens cannot give
    token_keys: bool = True

    def apply_payload(self, payload: bytes) -> None:
        """One published batch, exactly as it came off the socket."""
        batch = msgpack.unpackb(payload)
        assert isinstance(batch, list) and len(batch) == 3, batch  # [ts, events, dp_rank]
        ts, events, rank = batch
        assert isinstance(ts, float) and rank == 0
        self.apply(events)

    def apply(self, events: list[list[Any]]) -> None:
        for ev in events:
            tag = ev[0]
            if tag == "BlockStored":
                self._stored(*ev[1:])
            elif tag == "BlockRemoved":
                hashes, medium = ev[1], ev[2]
                assert medium == "GPU"
                for h in hashes:
                    assert h in self.hashes, "removal of a hash never stored"
                    self.hashes.discard(h)
                self.removed += len(hashes)
            else:
                assert ev == ["AllBlocksCleared"], ev
                self.hashes.clear()
                self.cleared += 1

    def _stored(
        self,
        hashes: list[int],
        parent: int | None,
        tokens: list[int],
        block_size: int,
        lora_id: int | None,
        medium: str,
        lora_name: str | None,
    ) -> None:
        assert medium == "GPU" and (lora_id is None) == (lora_name is None)
        assert hashes and len(tokens) == block_size * len(hashes)
        if parent is not None and parent not in self.hashes:
            self.orphans += 1
        # llm-d's request keys for these tokens: the published hashes are exactly those
        key = self.hasher.root(lora_name) if parent is None else parent
        for i, h in enumerate(hashes):
            key = self.hasher.block(key, tokens[i * block_size : (i + 1) * block_size])
            assert h == key or not self.token_keys, "published hash is not llm-d's key for the block's tokens"
            key = h
            assert h not in self.hashes, "hash stored twice"
            self.hashes.add(h)
        self.stored += len(hashes)
