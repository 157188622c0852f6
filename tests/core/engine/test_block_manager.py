"""Block pool accounting and prefix caching, no tensors."""

from __future__ import annotations

import random

import pytest
from rillet.core.engine.block_manager import BlockManager
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq

_ids = iter(range(10**9))


def seq(tokens: list[int]) -> Seq:
    return Seq(next(_ids), "r", list(tokens), SamplingParams(max_tokens=8))


def run_prefill(bm: BlockManager, s: Seq, budget: int = 10**6) -> None:
    n = bm.admit(s, budget)
    assert n > 0
    s.num_computed += n
    bm.commit(s)


def test_admit_grow_free_keeps_pool_whole() -> None:
    bm = BlockManager(num_blocks=9, block_size=4, enable_prefix_caching=False)
    s = seq(list(range(10)))
    assert bm.admit(s, 100) == 10
    assert len(s.block_table) == 3 and 0 not in s.block_table
    assert bm.num_used == 3
    s.num_computed = 10
    assert bm.grow(s, 13) and len(s.block_table) == 4
    bm.check_integrity()
    bm.free(s)
    assert bm.num_used == 0 and s.block_table == []
    bm.check_integrity()


def test_admit_is_all_or_nothing() -> None:
    bm = BlockManager(num_blocks=3, block_size=4, enable_prefix_caching=False)  # 2 usable
    s = seq(list(range(12)))
    assert bm.admit(s, 100) == 0
    assert s.block_table == [] and bm.num_used == 0
    assert bm.admit(s, 8) == 8  # a smaller first chunk fits
    bm.check_integrity()


def test_prefix_hit_reuses_full_blocks_and_recomputes_last_token() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq(list(range(12)))
    run_prefill(bm, a)
    # Exactly 12 tokens = 3 full blocks, but the last token must be recomputed: 2 blocks hit.
    b = seq(list(range(12)))
    assert bm.admit(b, 100) == 4
    assert b.num_computed == 8 and b.num_cached == 8
    assert b.block_table[:2] == a.block_table[:2]
    assert bm.ref_count[a.block_table[0]] == 2
    bm.check_integrity()


def test_diverging_inside_a_block_shares_only_earlier_blocks() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    run_prefill(bm, a)
    b = seq([1, 2, 3, 4, 5, 6, 0, 8, 9, 10])
    bm.admit(b, 100)
    assert b.num_cached == 4 and b.block_table[0] == a.block_table[0]
    assert b.block_table[1] != a.block_table[1]


def test_chained_key_covers_everything_before() -> None:
    bm = BlockManager(num_blocks=16, block_size=2)
    run_prefill(bm, seq([1, 2, 3, 4, 5]))
    # Same second block [3, 4] but a different first block: no hit at all.
    b = seq([9, 9, 3, 4, 5])
    bm.admit(b, 100)
    assert b.num_cached == 0


def test_freed_blocks_stay_cached_until_needed_then_lru_evicted() -> None:
    bm = BlockManager(num_blocks=7, block_size=2)  # 6 usable
    a = seq([1, 2, 3, 4, 5])
    run_prefill(bm, a)
    bm.free(a)
    assert bm.num_cached == 2 and bm.num_used == 0 and bm.num_free == 6
    bm.check_integrity()
    again = seq([1, 2, 3, 4, 5])
    bm.admit(again, 100)
    assert again.num_cached == 4
    bm.free(again)
    # A big unrelated request needs every block: the cached ones are evicted, the pool stays whole.
    big = seq(list(range(100, 112)))
    assert bm.admit(big, 100) == 12
    assert bm.num_cached == 0
    bm.check_integrity()
    bm.free(big)
    bm.check_integrity()


def test_cached_free_hits_are_counted_against_capacity() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)  # 3 usable
    a = seq([1, 2, 3, 4, 5])
    run_prefill(bm, a)
    bm.free(a)  # 2 cached-free blocks, 1 plain free
    b = seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    # Hits take the 2 cached blocks; the remaining 5 tokens need 3 more blocks, only 1 is left.
    assert bm.admit(b, 100) == 0
    assert b.block_table == []
    bm.check_integrity()


def test_reset_forgets_free_blocks_and_keeps_held_ones() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    done, held = seq(list(range(12))), seq(list(range(100, 112)))
    run_prefill(bm, done)
    run_prefill(bm, held)
    bm.free(done)  # its 3 full blocks stay cached, free
    assert bm.reset_prefix_cache() == (3, 3)  # forgotten: done's; kept: held's (still in use)
    assert bm.num_cached == 3 and bm.match_prefix(seq(list(range(12)))) == []
    assert len(bm.match_prefix(seq(list(range(100, 113))))) == 3  # held's prefix still hits
    bm.check_integrity()
    bm.free(held)  # back to the cache once released
    assert bm.num_cached == 3 and bm.num_used == 0
    assert bm.reset_prefix_cache() == (3, 0) and bm.num_cached == 0
    bm.check_integrity()


def test_disabled_prefix_caching_never_hits() -> None:
    bm = BlockManager(num_blocks=16, block_size=2, enable_prefix_caching=False)
    run_prefill(bm, seq([1, 2, 3, 4, 5]))
    b = seq([1, 2, 3, 4, 5])
    bm.admit(b, 100)
    assert b.num_cached == 0 and bm.num_cached == 0


def test_double_free_is_caught() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    s = seq([1, 2, 3])
    bm.admit(s, 10)
    table = list(s.block_table)
    bm.free(s)
    s.block_table = table
    with pytest.raises(AssertionError):
        bm.free(s)


def test_random_workload_never_breaks_integrity() -> None:
    rng = random.Random(0)
    bm = BlockManager(num_blocks=40, block_size=4)
    live: list[Seq] = []
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 20))] for _ in range(5)]
    for _ in range(2000):
        if live and rng.random() < 0.4:
            bm.free(live.pop(rng.randrange(len(live))))
        else:
            toks = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 10))]
            s = seq(toks)
            n = bm.admit(s, rng.randrange(1, 30))
            if n:
                s.num_computed += n
                bm.commit(s)
                if bm.grow(s, s.num_computed + 5):
                    live.append(s)
                else:
                    bm.free(s)
        bm.check_integrity()
    for s in live:
        bm.free(s)
    bm.check_integrity()
    assert bm.num_used == 0
