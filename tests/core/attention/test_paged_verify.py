"""The graph-safe verify attention (attention/paged_verify.py) against plain SDPA over each row's
full K/V: several query tokens per row, causal among themselves, rows padded to Q with their
padding queries writing only to the dummy slot; eager (matmul) and the two forms Inductor compiles
(the gathered contexts through GEMMs on CPU, SDPA on CUDA; the reductions, for soft-capped
scores); and the CPU's GEMMs against the SDPA form CUDA compiles."""

from __future__ import annotations

import random

import pytest
import torch
from rillet.core.attention import paged_verify
from rillet.core.attention.base import VerifyMetadata
from rillet.core.attention.paged_decode import gather_head_major, gemms_over_context, sdpa_over_context
from rillet.core.attention.paged_verify import paged_verify_attention
from test_attention_torch import BS, HKV, HQ, NUM_BLOCKS, SCALE, D, reference

pytestmark = pytest.mark.isa  # run again under an AVX2 cap (tests/test_isa_cap.py)


def run(
    rows: list[tuple[int, int]],
    nq: int,
    form: str,
    seed: int = 0,
    window: int | None = None,
    softcap: float | None = None,
) -> None:
    """rows: (cached tokens, new tokens <= nq) per row."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    pool = list(range(1, NUM_BLOCKS))
    rng.shuffle(pool)
    k_cache = torch.zeros(NUM_BLOCKS, BS, HKV, D)
    v_cache = torch.zeros(NUM_BLOCKS, BS, HKV, D)
    width = max(-(-(c + n) // BS) for c, n in rows) + 1
    tables = torch.zeros(len(rows), width, dtype=torch.int32)
    slots = torch.zeros(len(rows), nq, dtype=torch.int64)
    q = torch.randn(len(rows) * nq, HQ, D, generator=gen)
    k = torch.randn(len(rows) * nq, HKV, D, generator=gen)
    v = torch.randn(len(rows) * nq, HKV, D, generator=gen)
    want = []
    for r, (cached, new) in enumerate(rows):
        s = cached + new
        table, pool = pool[: -(-s // BS)], pool[-(-s // BS) :]
        tables[r, : len(table)] = torch.tensor(table)
        seq_slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(s)])
        ck, cv = torch.randn(cached, HKV, D, generator=gen), torch.randn(cached, HKV, D, generator=gen)
        k_cache.view(-1, HKV, D)[seq_slots[:cached]] = ck
        v_cache.view(-1, HKV, D)[seq_slots[:cached]] = cv
        slots[r, :new] = seq_slots[cached:]
        rq = slice(r * nq, r * nq + new)
        want.append(reference(q[rq], torch.cat([ck, k[rq]]), torch.cat([cv, v[rq]]), window, softcap))
    meta = VerifyMetadata(
        slots,
        torch.tensor([c + n for c, n in rows], dtype=torch.int32),
        torch.tensor([n for _, n in rows], dtype=torch.int32),
        tables,
    )
    before = k_cache.clone()
    # eager: the matmul form
    out = paged_verify_attention(q, k, v, k_cache, v_cache, meta, SCALE, window=window, softcap=softcap)
    if form != "matmul":  # a form torch.compile traces (same cache, already written)
        attend = paged_verify._attend_fused if form == "fused" else paged_verify._attend_gathered
        out = attend(q, k_cache, v_cache, meta, SCALE, window, softcap)
    for r, (_, new) in enumerate(rows):
        torch.testing.assert_close(out[r * nq : r * nq + new], want[r], rtol=1e-5, atol=1e-5)
        assert torch.isfinite(out[r * nq : (r + 1) * nq]).all()  # padding queries too
    # only the real slots and the dummy block changed
    changed = (k_cache != before).any(-1).any(-1).view(-1).nonzero().flatten().tolist()
    real = set(slots[slots > 0].tolist())
    assert set(changed) <= real | set(range(BS))


FORMS = ["matmul", "fused", "gathered"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    ("rows", "nq"),
    [([(5, 3)], 3), ([(7, 5), (0, 1), (12, 2), (3, 4)], 5), ([(1, 1), (9, 1)], 2), ([(16, 9)], 9)],
)
def test_verify_attention_matches_sdpa(rows: list[tuple[int, int]], nq: int, form: str) -> None:
    run(rows, nq, form)


@pytest.mark.parametrize("form", FORMS)
def test_verify_attention_keeps_sliding_windows_and_soft_caps(form: str) -> None:
    """Gemma-style layers: each verify query sees its own last `window` positions, scores capped
    (not by the gathered form: the compiled step takes the reductions then)."""
    rows = [(20, 4), (3, 2), (9, 5)]
    run(rows, 5, form, seed=3, window=6)
    if form != "gathered":
        run(rows, 5, form, seed=4, softcap=2.0)
        run(rows, 5, form, seed=5, window=4, softcap=1.5)


def test_short_prefill_rows_with_long_contexts() -> None:
    """A prefill tail as a multi-query row: many queries over a long cached context, beside a
    verify row and a fresh prompt (graphs.short_prefill)."""
    for form in FORMS:
        run([(44, 12), (20, 3), (0, 9)], 12, form, seed=7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nq", [1, 4])
def test_cpu_gemms_equal_cudas_sdpa(nq: int, dtype: torch.dtype) -> None:
    """gemms_over_context (the compiled CPU steps) and sdpa_over_context (CUDA's), the same rows:
    grouped query heads, causal visibility inside the queries, rows of different context lengths
    over shuffled block tables (SDPA runs on CPU too)."""
    gen = torch.Generator().manual_seed(11)
    b, width = 3, 5
    k_cache = torch.randn(NUM_BLOCKS, BS, HKV, D, generator=gen).to(dtype)
    v_cache = torch.randn(NUM_BLOCKS, BS, HKV, D, generator=gen).to(dtype)
    pool = list(range(1, NUM_BLOCKS))
    random.Random(11).shuffle(pool)
    tables = torch.tensor(pool[: b * width], dtype=torch.int32).view(b, width)
    seq_lens = torch.tensor([BS * width, 9, nq], dtype=torch.int32)
    qpos = (seq_lens - nq)[:, None] + torch.arange(nq)  # [B, Q]
    pos = torch.arange(width * BS)
    visible = ((pos <= qpos[:, :, None]) & (pos < seq_lens[:, None, None]))[:, None]  # [B, 1, Q, S]
    qh = torch.randn(b, HQ, nq, D, generator=gen).to(dtype)
    kc, vc = gather_head_major(k_cache, v_cache, None, tables, dtype)
    got = gemms_over_context(qh, kc, vc, visible, SCALE)
    want = sdpa_over_context(qh, kc, vc, visible, SCALE)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 0.02, "atol": 0.02}
    torch.testing.assert_close(got, want, **tol)
