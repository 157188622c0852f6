"""What the block manager does to its prefix cache, as vLLM's KV-cache events.

The block manager calls this only when kv_events is on (it holds None otherwise: no per-block work
at all). Events are kept in vLLM's wire shape (msgspec array_like tagged unions, see
vllm/distributed/kv_events.py), ready to be packed by the publisher thread:

  ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name]
  ["BlockRemoved", block_hashes, medium]
  ["AllBlocksCleared"]

A block's hash is published when it is registered (findable by later requests) and withdrawn when
its key is dropped (evicted, or the cache reset), so the set of stored-and-not-removed hashes is
always the set of registered blocks' hashes. Consecutive blocks of one sequence registered in one
commit go out as one BlockStored, as vLLM sends them. Two registered blocks can share a hash (an
adapter reloaded under its old name: rillet keys blocks by the load, llm-d by the name); such a
hash is stored with the first and removed with the last.
"""

from __future__ import annotations

from typing import Any, cast

from rillet.core.engine.kv_events.hashing import BlockHasher
from rillet.core.sequence import Seq

# vLLM's MEDIUM_GPU: the engine's own KV pool, as opposed to an offload tier (llm-d's "gpu" tier)
MEDIUM = "GPU"

Event = list[Any]


class KVEventRecorder:
    def __init__(self, block_size: int, hasher: BlockHasher) -> None:
        self.block_size = block_size
        self.hasher = hasher
        self.pending: list[Event] = []  # this step's events, oldest first; taken by the engine
        self._hash_of: dict[int, int] = {}  # registered block -> its published hash
        self._holders: dict[int, int] = {}  # published hash -> how many registered blocks have it
        self._chains: dict[int, list[int]] = {}  # seq_id -> published hash of each full block
        self._run: Event | None = None  # the BlockStored being extended within one commit

    # ---- called by the block manager ---------------------------------------------------------
    def admitted(self, seq: Seq, hits: list[int]) -> None:
        self._chains[seq.seq_id] = [self._hash_of[b] for b in hits]

    def full_block(self, seq: Seq, key: tuple[object, ...], block: int, registered: bool) -> None:
        """The next full block of `seq` has K/V for the block key's tokens (then, where images
        overlap the block, their `(content_hash, offset)`); `registered`: it is now findable."""
        chain = self._chains.setdefault(seq.seq_id, [])
        lora = seq.lora
        parent = chain[-1] if chain else self.hasher.root(None if lora is None else lora.name)
        tokens = cast("tuple[int, ...]", key[: self.block_size])
        images = cast("tuple[tuple[bytes, int], ...]", key[self.block_size :])
        h = self.hasher.block(parent, tokens, images)
        chain.append(h)
        if not registered:
            return
        self._hash_of[block] = h
        held = self._holders.get(h, 0)
        self._holders[h] = held + 1
        if held:
            return  # already published by another block
        run = self._run
        if run is not None and run[1][-1] == parent:
            run[1].append(h)
            run[3].extend(tokens)
            return
        self.flush()
        lora_id, lora_name = (None, None) if lora is None else (lora.uid, lora.name)
        first = parent if len(chain) > 1 else None
        self._run = ["BlockStored", [h], first, list(tokens), self.block_size, lora_id, MEDIUM, lora_name]

    def flush(self) -> None:
        """Ends the BlockStored being extended (the block manager calls it after each commit)."""
        if self._run is not None:
            self.pending.append(self._run)
            self._run = None

    def freed(self, seq_id: int) -> None:
        self._chains.pop(seq_id, None)

    def dropped(self, blocks: list[int]) -> None:
        """These registered blocks lost their keys (evicted, or forgotten by a reset)."""
        self.flush()
        gone = [h for h in (self._release(b) for b in blocks) if h is not None]
        if not gone:
            return
        last = self.pending[-1] if self.pending else None
        if last is not None and last[0] == "BlockRemoved":
            last[1].extend(gone)
        else:
            self.pending.append(["BlockRemoved", gone, MEDIUM])

    def cleared(self, blocks: list[int]) -> None:
        """A reset forgot `blocks` and no registered block is left: one AllBlocksCleared, as vLLM's
        reset_prefix_cache sends, in place of a removal per block."""
        self.flush()
        for b in blocks:
            self._release(b)
        assert not self._hash_of, "AllBlocksCleared while blocks are still registered"
        self.pending.append(["AllBlocksCleared"])

    # ---- read by the engine and by tests -----------------------------------------------------
    def take(self) -> list[Event]:
        events, self.pending = self.pending, []
        return events

    def published(self) -> set[int]:
        """The hashes a subscriber that applied every event so far holds."""
        return set(self._holders)

    def hash_of(self, block: int) -> int:
        return self._hash_of[block]

    def _release(self, block: int) -> int | None:
        """The block's hash if no other registered block has it, else None."""
        h = self._hash_of.pop(block)
        held = self._holders[h] - 1
        if held:
            self._holders[h] = held
            return None
        del self._holders[h]
        return h
