"""Block accounting for the paged KV cache, with automatic prefix caching. No tensors here.

Every KV block is in exactly one of three states:
  used        ref_count > 0: held by one or more running sequences
  cached-free ref_count == 0 but its K/V are a known full block of tokens (it has a key); it stays
              reusable until the pool needs it, least recently freed first out
  free        ref_count == 0 and no key
Block 0 is the reserved dummy block (padding rows of a batch point at it) and is never handed out.

Prefix caching: a full block is identified by a chained key (parent hash, its tokens), so a key
covers every token before it. On admission a sequence takes every leading full block whose key is
in the table and prefills only the rest; the last token is always recomputed so there are logits to
sample from. Blocks are registered once all their tokens have K/V in the cache. A LoRA request's
chain starts from its adapter (`_root`): the same tokens under another adapter, or the base model,
have other K/V, and a hit across them would be a silent wrong answer.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from rillet.core.sequence import Seq

if TYPE_CHECKING:
    from rillet.core.engine.kv_events.recorder import KVEventRecorder

BlockKey = tuple[int, tuple[object, ...]]  # (hash of the parent key or the root, its tokens [+ images])


def _root(seq: Seq) -> int:
    """The parent of a sequence's first block: 0 for the base model, its adapter's own value for a
    LoRA request (the uid of that load: a reloaded adapter shares nothing with the old one)."""
    return 0 if seq.lora is None else hash(("lora", seq.lora.uid))


@dataclass
class PrefixStats:
    queried_tokens: int = 0  # prompt tokens looked up at admission
    hit_tokens: int = 0  # of those, reused from the cache
    evictions: int = 0  # cached blocks dropped to make room


class PrefixFlush(NamedTuple):
    """What `reset_prefix_cache` did: blocks forgotten (they are free now), and blocks that keep
    their keys because running sequences hold them (they are cached again once released)."""

    flushed_blocks: int
    kept_blocks: int


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError("num_blocks must be >= 2 (block 0 is reserved)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self._free: list[int] = list(range(num_blocks - 1, 0, -1))  # pop() hands out low ids first
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # LRU: first = evicted first
        self._key_of: dict[int, BlockKey] = {}
        self._block_of: dict[BlockKey, int] = {}
        # Chained hashes of each running sequence's full, registered blocks, by seq_id.
        self._seq_hashes: dict[int, list[int]] = {}
        self.stats = PrefixStats()
        # kv_events.enabled: told of every block registered or dropped (kv_events/recorder.py)
        self.events: KVEventRecorder | None = None

    # ---- capacity ---------------------------------------------------------------------------
    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        """Blocks a new allocation can take (free + evictable cached)."""
        return len(self._free) + len(self._cached_free)

    @property
    def num_used(self) -> int:
        return self.num_usable - self.num_free

    @property
    def num_cached(self) -> int:
        return len(self._key_of)

    def blocks_needed(self, seq: Seq, num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    # ---- admission with prefix lookup --------------------------------------------------------
    def match_prefix(self, seq: Seq) -> list[int]:
        """Cached blocks that hold the leading full blocks of `seq` (never its last token)."""
        return self._lookup(seq)[0]

    def _lookup(self, seq: Seq) -> tuple[list[int], list[int]]:
        """(hit blocks, their chained hashes), so admission need not hash the prefix again."""
        hits: list[int] = []
        hashes: list[int] = []
        if not self.enable_prefix_caching or (seq.embed is not None and seq.embed.every_token):
            return hits, hashes  # mean / cls pooling reads every token's hidden state: no hits
        if seq.wants_prompt_lps:
            return hits, hashes  # prompt logprobs come from every prompt position's forward
        for i in range((seq.num_tokens - 1) // self.block_size):
            key = self._key(seq, i, hashes[-1] if hashes else _root(seq))
            block = self._block_of.get(key)
            if block is None:
                break
            hits.append(block)
            hashes.append(hash(key))
        return hits, hashes

    def _key(self, seq: Seq, i: int, parent: int) -> BlockKey:
        bs = self.block_size
        tokens = tuple(seq.tokens(i * bs, (i + 1) * bs))
        if seq.mm is None:
            return (parent, tokens)
        # two images of one size expand to the same placeholder ids: a block an image overlaps is
        # keyed on the image's pixels too (with the image's first token, for one cut across blocks)
        images = tuple((it.content_hash, it.offset) for it in seq.mm.overlapping(i * bs, (i + 1) * bs))
        return (parent, tokens + images) if images else (parent, tokens)

    def admit(self, seq: Seq, budget: int) -> int:
        """Takes prefix hits plus blocks for the first chunk (at most `budget` tokens) after them.

        Returns the chunk's token count, or 0 (nothing taken) when the pool cannot hold it.
        """
        assert not seq.block_table, "admit() on a sequence that holds blocks"
        hits, hashes = self._lookup(seq)
        cached = len(hits) * self.block_size
        chunk = min(seq.num_tokens - cached, budget)
        if seq.mm is not None:  # a chunk never splits a bidirectional image (Gemma 3)
            chunk = seq.mm.chunk_tokens(cached, chunk)
        need = -(-(cached + chunk) // self.block_size) - len(hits)
        # Hits that are cached-free leave the evictable pool when taken: count them against it.
        free_hits = sum(1 for b in hits if self.ref_count[b] == 0)
        if chunk <= 0 or need > self.num_free - free_hits:
            return 0
        for b in hits:
            self._ref(b)
        seq.block_table = hits + [self._take() for _ in range(need)]
        seq.num_computed = cached
        self._seq_hashes[seq.seq_id] = hashes
        if self.events is not None:
            self.events.admitted(seq, hits)
        if seq.num_preemptions == 0:
            seq.num_cached = cached
            self.stats.queried_tokens += seq.prompt_len
            self.stats.hit_tokens += min(cached, seq.prompt_len)
        return chunk

    def grow(self, seq: Seq, num_tokens: int) -> bool:
        """Makes the block table cover `num_tokens` tokens; False (nothing taken) if out of blocks."""
        need = self.blocks_needed(seq, num_tokens)
        if need > self.num_free:
            return False
        seq.block_table.extend(self._take() for _ in range(need))
        return True

    def truncate(self, seq: Seq, num_tokens: int) -> None:
        """Gives back the blocks past the first `num_tokens` tokens' (speculative decoding: the
        slots of refused draft tokens). They hold no registered block: commit() registers only
        blocks of tokens the sequence has, and refused drafts never were its tokens."""
        keep = -(-num_tokens // self.block_size)
        table = seq.block_table
        if len(table) <= keep:
            return
        # a new list: whoever mirrors the table (the runner's device copy, persistent_batch.py) sees a
        # different table, not one that may regrow to the same length with other blocks
        seq.block_table = table[:keep]
        for b in reversed(table[keep:]):
            assert b not in self._key_of, f"block {b} past the accepted end is registered"
            self._unref(b)

    # ---- after a step: register newly full blocks --------------------------------------------
    def commit(self, seq: Seq) -> None:
        """Call once `seq.num_computed` has advanced: full blocks become findable by later requests.

        A block is keyed by its tokens, so one holding a pending token (overlap: computed on the
        device, id not yet on the host) waits for the next commit after the host has that token."""
        if not self.enable_prefix_caching:
            return
        hashes = self._seq_hashes.setdefault(seq.seq_id, [])
        events = self.events
        for i in range(len(hashes), min(seq.num_computed, seq.num_tokens) // self.block_size):
            key = self._key(seq, i, hashes[-1] if hashes else _root(seq))
            block = seq.block_table[i]
            registered = key not in self._block_of and block not in self._key_of
            if registered:
                self._block_of[key] = block
                self._key_of[block] = key
            hashes.append(hash(key))
            if events is not None:
                events.full_block(seq, key[1], block, registered)
        if events is not None:
            events.flush()

    # ---- release -----------------------------------------------------------------------------
    def free(self, seq: Seq) -> None:
        """Drops the sequence's references; its tail blocks become the first to be evicted."""
        for b in reversed(seq.block_table):
            self._unref(b)
        seq.block_table = []
        seq.num_computed = 0
        self._seq_hashes.pop(seq.seq_id, None)
        if self.events is not None:
            self.events.freed(seq.seq_id)

    def reset_prefix_cache(self) -> PrefixFlush:
        """Forgets every cached-free block. Used blocks keep their keys: a running sequence's
        blocks stay findable (forgetting them would only make its next block's key differ from an
        identical request's), and return to the cache when it releases them. With kv_events on:
        one AllBlocksCleared when no block keeps a key, else a BlockRemoved of the forgotten ones."""
        forgotten = list(self._cached_free)
        for b in forgotten:
            del self._block_of[self._key_of.pop(b)]
            self._free.append(b)
        self._cached_free.clear()
        if self.events is not None and forgotten:
            if self._key_of:
                self.events.dropped(forgotten)
            else:
                self.events.cleared(forgotten)
        return PrefixFlush(len(forgotten), len(self._key_of))

    # ---- internals ---------------------------------------------------------------------------
    def _ref(self, b: int) -> None:
        if self.ref_count[b] == 0:
            self._cached_free.pop(b, None)
        self.ref_count[b] += 1

    def _unref(self, b: int) -> None:
        assert self.ref_count[b] > 0, f"block {b} freed twice"
        self.ref_count[b] -= 1
        if self.ref_count[b] == 0:
            if b in self._key_of:
                self._cached_free[b] = None
            else:
                self._free.append(b)

    def _take(self) -> int:
        if self._free:
            b = self._free.pop()
        else:
            b, _ = self._cached_free.popitem(last=False)
            del self._block_of[self._key_of.pop(b)]
            self.stats.evictions += 1
            if self.events is not None:
                self.events.dropped([b])
        self.ref_count[b] = 1
        return b

    # ---- checks ------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """free + cached-free + used == usable; no block in two states; the key maps agree."""
        free, cached = set(self._free), set(self._cached_free)
        used = {b for b in range(1, self.num_blocks) if self.ref_count[b] > 0}
        problems: list[str] = []
        if self.ref_count[0] != 0 or 0 in free or 0 in cached:
            problems.append("dummy block 0 handed out")
        if any(r < 0 for r in self.ref_count):
            problems.append("negative ref count")
        if len(free) != len(self._free):
            problems.append("duplicate in free list")
        if free & cached or free & used or cached & used:
            problems.append("block in two states")
        if len(free) + len(cached) + len(used) != self.num_usable:
            problems.append(
                f"leak: free {len(free)} + cached {len(cached)} + used {len(used)} != {self.num_usable}"
            )
        if any(self._block_of.get(k) != b for b, k in self._key_of.items()) or len(self._block_of) != len(
            self._key_of
        ):
            problems.append("key tables disagree")
        if not cached <= set(self._key_of):
            problems.append("cached-free block without a key")
        if problems:
            raise AssertionError("block pool broken: " + "; ".join(problems))
