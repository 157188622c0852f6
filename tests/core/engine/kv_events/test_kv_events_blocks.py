"""KV-cache events from the block manager (core/engine/kv_events/): the index a subscriber rebuilds
from the events alone equals the block manager's own after every operation (prefills sharing
prefixes, decode, eviction, preemption, reset, LoRA), and the published hashes are llm-d's keys."""

from __future__ import annotations

import random

import cbor2
import pytest
from core_helpers.kv_event_index import EventIndex
from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.kv_events.hashing import BlockHasher, cbor_payload, fnv1a_64
from rillet.core.engine.kv_events.recorder import KVEventRecorder
from rillet.core.lora.adapter import LoraAdapter
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq

BS = 4
_ids = iter(range(10**9))


def seq(tokens: list[int], lora: LoraAdapter | None = None) -> Seq:
    s = Seq(next(_ids), "r", list(tokens), SamplingParams(max_tokens=8))
    s.lora = lora
    return s


def pool(num_blocks: int) -> tuple[BlockManager, EventIndex]:
    bm = BlockManager(num_blocks, BS)
    hasher = BlockHasher("tiny-model", "seed")
    bm.events = KVEventRecorder(BS, hasher)
    return bm, EventIndex(BlockHasher("tiny-model", "seed"))


def sync(bm: BlockManager, index: EventIndex) -> None:
    """Applies the pending events; the subscriber's index must equal the pool's registered blocks."""
    rec = bm.events
    assert rec is not None
    index.apply(rec.take())
    registered = {rec.hash_of(b) for b in bm._key_of}
    assert index.hashes == registered == rec.published()
    bm.check_integrity()


def prefill(bm: BlockManager, s: Seq, budget: int = 10**6) -> bool:
    n = bm.admit(s, budget)
    if n == 0:
        return False
    s.num_computed += n
    bm.commit(s)
    return True


def test_cbor_and_fnv_match_the_references() -> None:
    # FNV-1a 64 test vectors (the offset basis; "a")
    assert fnv1a_64(b"") == 0xCBF29CE484222325 and fnv1a_64(b"a") == 0xAF63DC4C8601EC8C
    cases = [
        (0, [1, 2, 3], None),
        (2**64 - 1, [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1], "x" * 30),
        (5, None, "HuggingFaceTB/SmolLM2-135M-Instruct"),
        (1 << 40, list(range(300)), ""),
    ]
    for parent, tokens, extra in cases:
        assert cbor_payload(parent, tokens, extra) == cbor2.dumps([parent, tokens, extra], canonical=True)
    hasher = BlockHasher("m")
    for parent, tokens, _ in cases:
        if tokens is not None:  # the cached-items path hashes the same bytes
            assert hasher.block(parent, tokens) == fnv1a_64(cbor_payload(parent, tokens, None))
    assert hasher.root("m") == fnv1a_64(cbor2.dumps([fnv1a_64(b""), None, "m"], canonical=True))


def test_prefill_publishes_one_stored_run_with_llmd_keys() -> None:
    bm, index = pool(16)
    prompt = list(range(100, 114))  # 3 full blocks + 2 tokens
    prefill(bm, seq(prompt))
    events = bm.events.take() if bm.events else []
    assert len(events) == 1
    tag, hashes, parent, tokens, block_size, lora_id, medium, lora_name = events[0]
    assert (tag, parent, tokens, block_size, lora_id, medium, lora_name) == (
        "BlockStored",
        None,
        prompt[:12],
        BS,
        None,
        "GPU",
        None,
    )
    # what llm-d's scorer computes from the prompt, with the same seed and model name
    assert hashes == BlockHasher("tiny-model", "seed").chain(prompt, BS)
    assert hashes != BlockHasher("other-model", "seed").chain(prompt, BS)
    assert hashes != BlockHasher("tiny-model", "").chain(prompt, BS)
    index.apply(events)


def test_shared_prefix_stores_only_the_new_blocks_with_their_parent() -> None:
    bm, index = pool(32)
    a = seq([*list(range(12)), 7, 7, 7, 7])
    prefill(bm, a)
    sync(bm, index)
    b = seq([*list(range(12)), 9, 9, 9, 9, 9])
    prefill(bm, b)
    events = bm.events.take() if bm.events else []
    assert len(events) == 1 and events[0][2] == bm.events.hash_of(a.block_table[2])  # type: ignore[union-attr]
    assert events[0][3] == [9, 9, 9, 9]
    index.apply(events)
    sync(bm, index)


def test_eviction_removes_and_reset_clears() -> None:
    bm, index = pool(6)  # 5 usable blocks
    a = seq([*list(range(8)), 1])
    prefill(bm, a)
    bm.free(a)  # 2 cached-free blocks
    sync(bm, index)
    b = seq([*list(range(50, 66)), 1])  # needs all 5: both cached blocks are evicted
    prefill(bm, b)
    events = bm.events.take() if bm.events else []
    assert [e[0] for e in events] == ["BlockRemoved", "BlockStored"]
    assert len(events[0][1]) == 2
    index.apply(events)
    sync(bm, index)
    bm.reset_prefix_cache()  # b still holds its blocks: they keep their keys
    sync(bm, index)
    assert index.hashes
    bm.free(b)
    bm.reset_prefix_cache()
    events = bm.events.take() if bm.events else []
    assert events == [["AllBlocksCleared"]]
    index.apply(events)
    assert index.hashes == set() and bm.num_cached == 0


def test_lora_blocks_are_keyed_by_the_adapter_name() -> None:
    bm, index = pool(32)
    prompt = list(range(9))
    ad = LoraAdapter(name="sql-lora", path="/x", uid=7, rank=8, scale=1.0, weights={})
    prefill(bm, seq(prompt, ad))
    prefill(bm, seq(prompt))  # the base model: no hit, its own blocks
    events = bm.events.take() if bm.events else []
    assert [(e[5], e[7]) for e in events] == [(7, "sql-lora"), (None, None)]
    assert events[0][1] == BlockHasher("tiny-model", "seed").chain(prompt, BS, "sql-lora")
    index.apply(events)
    sync(bm, index)


@pytest.mark.parametrize("seed", range(4))
def test_random_workload_index_always_equals_the_pool(seed: int) -> None:
    """Prefills in chunks over shared prefixes, decode steps, finishes, preemptions and resets in a
    pool small enough to evict: after every operation the rebuilt index is the pool's."""
    rng = random.Random(seed)
    bm, index = pool(24)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(2, 14))] for _ in range(4)]
    running: list[Seq] = []
    preempted: list[Seq] = []
    for _ in range(300):
        op = rng.random()
        if op < 0.05 and preempted:  # resumed: admitted again, its own blocks now prefix hits
            s = preempted.pop()
            if prefill(bm, s, budget=rng.choice([4, 100])):
                running.append(s)
        elif op < 0.3 or not running:
            tail = [rng.randrange(1000) for _ in range(rng.randrange(1, 9))]
            s = seq(rng.choice(prefixes) + tail)
            if prefill(bm, s, budget=rng.choice([4, 7, 100])):
                running.append(s)
        elif op < 0.75:
            s = rng.choice(running)
            if s.num_computed < s.num_tokens:  # the next prefill chunk
                n = min(s.num_tokens - s.num_computed, rng.choice([3, 8]))
            else:
                s.output_ids.append(rng.randrange(1000))
                n = 1
            if bm.grow(s, s.num_computed + n):
                s.num_computed += n
                bm.commit(s)
        elif op < 0.9:
            s = running.pop(rng.randrange(len(running)))
            bm.free(s)  # finished, or preempted
            if rng.random() < 0.5:
                s.num_preemptions += 1
                preempted.append(s)
        elif op < 0.95:
            bm.reset_prefix_cache()
        sync(bm, index)
    for s in running:
        bm.free(s)
    bm.reset_prefix_cache()
    sync(bm, index)
    assert index.hashes == set() and index.stored > 0 and index.removed > 0
    assert bm.stats.evictions > 0 and bm.stats.hit_tokens > 0  # the workload did evict and share


def test_a_block_an_image_overlaps_carries_the_image_in_its_published_key() -> None:
    """Two prompts of the same placeholder ids with different images: their image blocks are
    published under different keys, none equal to the text-only key, each llm-d's CBOR payload
    with the images `[[content_hash, offset]]` as its extra keys; the index still matches."""
    import numpy as np
    from rillet.core.vision.payload import MmItem, MmPayload

    def with_image(digest: bytes) -> Seq:
        s = seq([7] * 8 + [1, 2])
        s.mm = MmPayload((MmItem(2, 4, digest, np.zeros((1, 1), np.float32)),))
        return s

    bm, index = pool(16)
    index.token_keys = False
    hasher = BlockHasher("tiny-model", "seed")
    a, b, text = with_image(b"\x01" * 32), with_image(b"\x02" * 32), seq([7] * 8 + [1, 2])
    for s in (a, b, text):
        assert prefill(bm, s)
        sync(bm, index)
    rec = bm.events
    assert rec is not None
    keys = [[rec.hash_of(blk) for blk in s.block_table[:2]] for s in (a, b, text)]
    assert len({k for ks in keys for k in ks}) == 6  # two images, the text: no block shared
    root = hasher.root(None)
    first = fnv1a_64(cbor2.dumps([root, [7] * 4, [[b"\x01" * 32, 2]]], canonical=True))
    assert keys[0][0] == first
    assert keys[2][0] == hasher.block(root, [7] * 4)
