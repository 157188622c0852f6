"""TorchAttentionBackend against plain attention over each sequence's full K/V, on shuffled block
tables: causal, with a sliding window, with soft-capped scores; and the graph-safe decode
(paged_decode.py), eager and compiled, with the same options."""

from __future__ import annotations

import random

import pytest
import torch
from rillet.core.attention.base import AttentionMetadata, DecodeMetadata
from rillet.core.attention.paged_decode import paged_decode_attention
from rillet.core.attention.torch_backend import TorchAttentionBackend

pytestmark = pytest.mark.isa  # run again under an AVX2 cap (tests/test_isa_cap.py)

BS, HQ, HKV, D, NUM_BLOCKS = 4, 6, 2, 8, 40
SCALE = D**-0.5


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None, softcap: float | None = None
) -> torch.Tensor:
    """q [L, Hq, D] = the last L positions of a context with k, v [S, Hkv, D] -> [L, Hq, D]:
    transformers' eager attention (a window keeps keys > query - window)."""
    n, s = q.shape[0], k.shape[0]
    qpos, kpos = torch.arange(s - n, s)[:, None], torch.arange(s)[None, :]
    mask = kpos <= qpos
    if window is not None:
        mask &= kpos > qpos - window
    g = HQ // HKV
    qt, kt, vt = (
        x.transpose(0, 1).float() for x in (q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1))
    )
    scores = qt @ kt.transpose(1, 2) * SCALE
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return (p @ vt).transpose(0, 1).to(q.dtype)


def run_case(
    cached_and_new: list[tuple[int, int]],
    pad_rows: int,
    seed: int,
    dtype: torch.dtype = torch.float32,
    backend: TorchAttentionBackend | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> None:
    """Each sequence has `cached` tokens already in the cache and `new` tokens in this step; sequences
    with new > 1 or cached == 0 come first (prefills), as the engine orders them."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    pool = list(range(1, NUM_BLOCKS))
    rng.shuffle(pool)
    k_cache = torch.randn(NUM_BLOCKS, BS, HKV, D, generator=gen).to(dtype)
    v_cache = torch.randn(NUM_BLOCKS, BS, HKV, D, generator=gen).to(dtype)
    full_k, full_v, tables, slots = [], [], [], []
    for cached, new in cached_and_new:
        s = cached + new
        table, pool = pool[: -(-s // BS)], pool[-(-s // BS) :]
        seq_slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(s)])
        k, v = (
            torch.randn(s, HKV, D, generator=gen).to(dtype),
            torch.randn(s, HKV, D, generator=gen).to(dtype),
        )
        k_cache.view(-1, HKV, D)[seq_slots[:cached]] = k[:cached]
        v_cache.view(-1, HKV, D)[seq_slots[:cached]] = v[:cached]
        full_k.append(k)
        full_v.append(v)
        tables.append(table)
        slots.append(seq_slots[cached:])
    qlens = [n for _, n in cached_and_new]
    slens = [c + n for c, n in cached_and_new]
    t = sum(qlens) + pad_rows
    q = torch.randn(t, HQ, D, generator=gen).to(dtype)
    pad = [torch.randn(pad_rows, HKV, D, generator=gen).to(dtype)]
    k_new = torch.cat([k[c:] for k, (c, _) in zip(full_k, cached_and_new, strict=True)] + pad)
    v_new = torch.cat([v[c:] for v, (c, _) in zip(full_v, cached_and_new, strict=True)] + pad)
    width = max(len(tb) for tb in tables)
    meta = AttentionMetadata(
        slot_mapping=torch.cat([*slots, torch.full((pad_rows,), -1)]),
        query_start=torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32),
        seq_lens=torch.tensor(slens, dtype=torch.int32),
        block_tables=torch.tensor([tb + [0] * (width - len(tb)) for tb in tables], dtype=torch.int32),
        query_lens_cpu=qlens,
        seq_lens_cpu=slens,
        block_size=BS,
        num_prefills=sum(1 for c, n in cached_and_new if n > 1 or c == 0),
    )
    untouched = k_cache.clone()
    out = (backend or TorchAttentionBackend()).forward(
        q, k_new, v_new, k_cache, v_cache, meta, SCALE, window=window, softcap=softcap
    )

    tol = 1e-5 if dtype == torch.float32 else 3e-2
    start = 0
    for b, (cached, new) in enumerate(cached_and_new):
        got = out[start : start + new]
        torch.testing.assert_close(
            got, reference(q[start : start + new], full_k[b], full_v[b], window, softcap), atol=tol, rtol=tol
        )
        # this step's K/V landed at its slots
        torch.testing.assert_close(k_cache.view(-1, HKV, D)[slots[b]], full_k[b][cached:], atol=0, rtol=0)
        torch.testing.assert_close(v_cache.view(-1, HKV, D)[slots[b]], full_v[b][cached:], atol=0, rtol=0)
        start += new
    assert not out[start:].any(), "padding rows must come back zero"
    written = torch.zeros(NUM_BLOCKS * BS, dtype=torch.bool)
    written[torch.cat(slots)] = True
    written[:BS] = True  # the dummy block may take the padding rows' writes
    keep = ~written.view(NUM_BLOCKS, BS)
    assert torch.equal(k_cache[keep], untouched[keep]), "a slot outside slot_mapping was written"


@pytest.mark.parametrize("seed", [0, 1])
def test_mixed_batch_fresh_chunked_and_decodes(seed: int) -> None:
    run_case([(0, 7), (5, 4), (8, 3), (0, 2), (10, 1), (3, 1), (15, 1)], pad_rows=3, seed=seed)


def test_fresh_prefills_only() -> None:
    run_case([(0, 9), (0, 1), (0, 4)], pad_rows=0, seed=2)


def test_chunked_prefill_across_block_boundaries() -> None:
    run_case([(4, 4), (3, 6), (1, 2)], pad_rows=1, seed=3)


@pytest.mark.parametrize("pad_rows", [0, 2])
@pytest.mark.parametrize("trim", [True, False], ids=["trimmed", "full-width"])
def test_decode_only_batch(pad_rows: int, trim: bool) -> None:
    backend = TorchAttentionBackend(trim_decode=trim)
    run_case([(6, 1), (11, 1), (3, 1), (20, 1)], pad_rows=pad_rows, seed=4, backend=backend)


@pytest.mark.parametrize(("window", "softcap"), [(3, None), (5, None), (None, 2.0), (4, 1.5)])
def test_sliding_window_and_softcap(window: int | None, softcap: float | None) -> None:
    """Fresh prompts longer and shorter than the window, chunks whose window starts blocks into
    the cache, decodes past it; soft-capped scores through the explicit path."""
    cases = [(0, 9), (0, 2), (5, 4), (13, 3), (10, 1), (3, 1), (22, 1)]
    run_case(cases, pad_rows=2, seed=7, window=window, softcap=softcap)
    run_case([(6, 1), (11, 1), (3, 1), (20, 1)], pad_rows=1, seed=8, window=window, softcap=softcap)


def test_bf16_mixed_batch() -> None:
    run_case([(0, 5), (6, 3), (9, 1), (2, 1)], pad_rows=1, seed=5, dtype=torch.bfloat16)


def test_graph_style_padding_sequences_leave_real_rows_alone() -> None:
    """graphs/ pads a decode batch with sequences of seq_len 1 over block 0, writing slot 0."""
    gen = torch.Generator().manual_seed(6)
    k_cache = torch.randn(NUM_BLOCKS, BS, HKV, D, generator=gen)
    v_cache = torch.randn(NUM_BLOCKS, BS, HKV, D, generator=gen)
    q = torch.randn(4, HQ, D, generator=gen)
    k, v = torch.randn(4, HKV, D, generator=gen), torch.randn(4, HKV, D, generator=gen)

    def meta(n: int) -> AttentionMetadata:
        lens = [7, 3, 1, 1][:n]
        return AttentionMetadata(
            slot_mapping=torch.tensor([9 * BS + 2, 4 * BS + 2, 0, 0][:n]),
            query_start=torch.arange(n + 1, dtype=torch.int32),
            seq_lens=torch.tensor(lens, dtype=torch.int32),
            block_tables=torch.tensor([[5, 9], [4, 0], [0, 0], [0, 0]][:n], dtype=torch.int32),
            query_lens_cpu=[1] * n,
            seq_lens_cpu=lens,
            block_size=BS,
            num_prefills=0,
        )

    backend = TorchAttentionBackend(trim_decode=False)
    alone = backend.forward(q[:2], k[:2], v[:2], k_cache.clone(), v_cache.clone(), meta(2), SCALE)
    padded = backend.forward(q, k, v, k_cache, v_cache, meta(4), SCALE)
    torch.testing.assert_close(padded[:2], alone, atol=1e-6, rtol=1e-6)
    assert torch.isfinite(padded).all()


@pytest.mark.parametrize(
    "compiled", [False, pytest.param(True, marks=pytest.mark.compiled)], ids=["eager", "compiled"]
)
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (5, None), (None, 2.0), (4, 1.5)])
def test_graph_safe_decode_window_softcap(compiled: bool, window: int | None, softcap: float | None) -> None:
    """paged_decode_attention, eager (batched matmuls) and compiled (head-major GEMMs; fused
    reductions for capped scores): each row against the reference over its own context; a padding
    row (seq_len 1, block 0) stays finite."""
    gen = torch.Generator().manual_seed(9)
    lens, width = [7, 13, 2, 20, 1], 6
    k_cache = torch.randn(NUM_BLOCKS, BS, HKV, D, generator=gen)
    v_cache = torch.randn(NUM_BLOCKS, BS, HKV, D, generator=gen)
    pool = list(range(1, NUM_BLOCKS))
    random.Random(9).shuffle(pool)
    tables = [pool[i * width : (i + 1) * width] for i in range(4)] + [[0] * width]
    slots = [tables[b][(n - 1) // BS] * BS + (n - 1) % BS for b, n in enumerate(lens[:4])] + [0]
    q = torch.randn(5, HQ, D, generator=gen)
    k, v = torch.randn(5, HKV, D, generator=gen), torch.randn(5, HKV, D, generator=gen)
    meta = DecodeMetadata(
        torch.tensor(slots), torch.tensor(lens, dtype=torch.int32), torch.tensor(tables, dtype=torch.int32)
    )

    def step(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor
    ) -> torch.Tensor:
        return paged_decode_attention(q, k, v, kc, vc, meta, SCALE, window=window, softcap=softcap)

    fn = torch.compile(step, fullgraph=True, dynamic=False) if compiled else step
    out = fn(q, k, v, k_cache, v_cache)
    for b, n in enumerate(lens[:4]):
        table = torch.tensor(tables[b])
        ctx = (table[:, None] * BS + torch.arange(BS)).reshape(-1)[:n]
        kf, vf = k_cache.view(-1, HKV, D)[ctx], v_cache.view(-1, HKV, D)[ctx]
        torch.testing.assert_close(
            out[b : b + 1], reference(q[b : b + 1], kf, vf, window, softcap), atol=1e-5, rtol=1e-5
        )
    assert torch.isfinite(out).all()
