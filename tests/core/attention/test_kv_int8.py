"""The int8 KV cache (attention/kv_cache.py): the codes and scales the write op stores, and every
attention path over an int8 pool against the same path over a float32 pool that holds the
dequantized values. The float paths are checked against plain attention elsewhere
(test_attention_torch.py, test_paged_verify.py), so agreement here means the int8 pool changes
nothing but the rounding of K/V it stores."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
from rillet.core.attention import paged_decode, paged_verify
from rillet.core.attention.base import AttentionMetadata, DecodeMetadata, VerifyMetadata
from rillet.core.attention.invariant import InvariantAttentionBackend
from rillet.core.attention.kv_cache import MIN_SCALE, QMAX, Scales, decode, encode, rotate, stored, write_rows
from rillet.core.attention.torch_backend import TorchAttentionBackend
from rillet.core.determinism.rows import RowPadding
from test_attention_torch import BS, HKV, HQ, NUM_BLOCKS, SCALE, D

pytestmark = pytest.mark.isa  # run again under an AVX2 cap (tests/test_isa_cap.py)

TOL = {"atol": 1e-5, "rtol": 1e-5}


def test_rotation_is_orthonormal_and_its_own_inverse() -> None:
    gen = torch.Generator().manual_seed(0)
    for d in (64, 8, 96):  # 96: blocks of 32 (the largest power of two dividing it)
        x = torch.randn(5, 3, d, generator=gen, dtype=torch.float64)
        r = rotate(x)
        torch.testing.assert_close(rotate(r), x)
        torch.testing.assert_close(r.norm(dim=-1), x.norm(dim=-1))
        h = rotate(torch.eye(d, dtype=torch.float64))
        torch.testing.assert_close(h @ h.T, torch.eye(d, dtype=torch.float64))
    e0 = torch.zeros(8)
    e0[0] = 1.0
    torch.testing.assert_close(rotate(e0), torch.full((8,), 8**-0.5))  # one channel spread over all


def test_traced_rotation_is_the_butterfly() -> None:
    """The compiled steps rotate with a matrix reduction (one loop nest), eager with the butterfly:
    the same map, to float rounding, for every head size's block structure."""
    traced = torch.compile(rotate, fullgraph=True, dynamic=False)
    gen = torch.Generator().manual_seed(1)
    for d in (64, 8, 96):
        x = torch.randn(2, 3, d, generator=gen)
        torch.testing.assert_close(traced(x), rotate(x), **TOL)


def test_codes_are_symmetric_per_token_and_head_and_round_to_nearest() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, HKV, D, generator=gen) * torch.rand(9, HKV, 1, generator=gen) * 10
    x[3, 1] = 0.0  # an all-zero head stays exactly zero
    x[5, 0, 2] = 1e4  # one outlier sets its own head's scale only
    codes, scale = encode(x, torch.int8)
    assert codes.dtype == torch.int8 and scale is not None and scale.shape == (9, HKV)
    assert scale.dtype == torch.float32
    assert int(codes.abs().max()) <= QMAX
    nonzero = x.abs().amax(-1) > 0
    assert (codes.abs().amax(-1)[nonzero] == QMAX).all()  # the largest value of a head maps to 127
    r = rotate(x)  # the codes hold the rotated values
    torch.testing.assert_close(scale, (r.abs().amax(-1) / QMAX).clamp(min=MIN_SCALE), atol=0, rtol=0)
    back = decode(codes, scale, torch.float32)
    assert ((back - r).abs() <= scale[..., None] / 2 * (1 + 1e-5) + 1e-6).all()  # round to nearest
    assert not back[3, 1].any()
    assert scale[5, 1] < scale[5, 0] / 100
    assert stored(x, torch.float32) is x  # a float32 pool keeps float32 values as they are
    torch.testing.assert_close(stored(x, torch.int8), back, atol=0, rtol=0)


@dataclass
class Pools:
    """The same context in an int8 pool (codes + scales) and a float32 pool of its dequantized values."""

    k8: torch.Tensor
    v8: torch.Tensor
    scales: Scales
    kf: torch.Tensor
    vf: torch.Tensor

    @classmethod
    def random(cls, seed: int) -> Pools:
        gen = torch.Generator().manual_seed(seed)
        k8, v8 = (torch.zeros(NUM_BLOCKS, BS, HKV, D, dtype=torch.int8) for _ in range(2))
        scales = (torch.zeros(NUM_BLOCKS, BS, HKV), torch.zeros(NUM_BLOCKS, BS, HKV))
        slots = torch.arange(NUM_BLOCKS * BS)
        for cache, scale in ((k8, scales[0]), (v8, scales[1])):
            write_rows(torch.randn(NUM_BLOCKS * BS, HKV, D, generator=gen) * 3, cache, scale, slots)
        kf, vf = decode(k8, scales[0], torch.float32), decode(v8, scales[1], torch.float32)
        return cls(k8, v8, scales, kf, vf)

    def assert_same_contents(self) -> None:
        torch.testing.assert_close(decode(self.k8, self.scales[0], torch.float32), self.kf, atol=0, rtol=0)
        torch.testing.assert_close(decode(self.v8, self.scales[1], torch.float32), self.vf, atol=0, rtol=0)


def _tables(lens: list[int], width: int, seed: int) -> torch.Tensor:
    pool = list(range(1, NUM_BLOCKS))
    random.Random(seed).shuffle(pool)
    return torch.tensor([pool[i * width : (i + 1) * width] for i in range(len(lens))], dtype=torch.int32)


def _slots(tables: torch.Tensor, positions: list[int]) -> torch.Tensor:
    return torch.tensor([int(tables[b, p // BS]) * BS + p % BS for b, p in enumerate(positions)])


@pytest.mark.parametrize("backend", ["torch", "invariant"])
def test_mixed_step_over_int8_equals_float_over_dequantized(backend: str) -> None:
    """A fresh prompt, a continued chunk and decodes in one step: the fresh prompt attends over its
    K/V as the cache stores them (what a later chunk or a prefix-cache hit reads back)."""
    pools = Pools.random(1)
    gen = torch.Generator().manual_seed(2)
    cached_new = [(0, 6), (5, 3), (9, 1), (14, 1)]
    lens = [c + n for c, n in cached_new]
    tables = _tables(lens, 5, seed=3)
    slots = torch.cat(
        [
            _slots(tables[b : b + 1].expand(n, -1), list(range(c, c + n)))
            for b, (c, n) in enumerate(cached_new)
        ]
    )
    t = sum(n for _, n in cached_new)
    q, k, v = (torch.randn(t, h, D, generator=gen) for h in (HQ, HKV, HKV))
    qlens = [n for _, n in cached_new]
    meta = AttentionMetadata(
        slot_mapping=slots,
        query_start=torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=tables,
        query_lens_cpu=qlens,
        seq_lens_cpu=lens,
        block_size=BS,
        num_prefills=2,
    )
    be = TorchAttentionBackend() if backend == "torch" else InvariantAttentionBackend(RowPadding(False))
    got = be.forward(q, k, v, pools.k8, pools.v8, meta, SCALE, scales=pools.scales)
    # the int8 pool's space is rotated: the same attention there, the query rotated in, out back
    kr, vr = stored(k, torch.int8), stored(v, torch.int8)
    want = rotate(be.forward(rotate(q), kr, vr, pools.kf, pools.vf, meta, SCALE))
    torch.testing.assert_close(got, want, **TOL)
    pools.assert_same_contents()  # the step's K/V landed as codes + scales at the same slots


@pytest.mark.parametrize("form", ["matmul", "fused", "gathered"])
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (5, 1.5), (4, None)])
def test_graph_safe_decode_over_int8(form: str, window: int | None, softcap: float | None) -> None:
    """paged_decode.py's eager (matmul) and traced (gathered: GEMMs on CPU, SDPA on CUDA; fused
    reductions for capped scores) forms, with a padding row."""
    if form == "gathered" and softcap is not None:
        pytest.skip("capped scores: the compiled step takes the reductions")
    pools = Pools.random(4)
    gen = torch.Generator().manual_seed(5)
    lens = [7, 13, 2, 20, 1]
    tables = _tables(lens, 6, seed=6)
    tables[-1] = 0  # the padding row: the dummy block, length 1
    meta = DecodeMetadata(
        _slots(tables, [n - 1 for n in lens]), torch.tensor(lens, dtype=torch.int32), tables
    )
    q, k, v = (torch.randn(5, h, D, generator=gen) for h in (HQ, HKV, HKV))
    opts = {"window": window, "softcap": softcap}
    kr, vr = stored(k, torch.int8), stored(v, torch.int8)
    if form == "matmul":  # the op as eager runs it: writes, rotates the query in and the output back
        got = paged_decode.paged_decode_attention(
            q, k, v, pools.k8, pools.v8, meta, SCALE, scales=pools.scales, **opts
        )
        want = rotate(
            paged_decode.paged_decode_attention(rotate(q), kr, vr, pools.kf, pools.vf, meta, SCALE, **opts)
        )
    else:  # a form torch.compile traces, over the caches written as the op writes them
        paged_decode.write_decode_kv(k, v, pools.k8, pools.v8, meta.slot_mapping, pools.scales)
        paged_decode.write_decode_kv(kr, vr, pools.kf, pools.vf, meta.slot_mapping)
        attend = paged_decode._attend_fused if form == "fused" else paged_decode._attend_gathered
        got = attend(q, pools.k8, pools.v8, meta, SCALE, scales=pools.scales, **opts)
        want = attend(q, pools.kf, pools.vf, meta, SCALE, **opts)
    pools.assert_same_contents()
    torch.testing.assert_close(got, want, **TOL)
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("form", ["matmul", "fused", "gathered"])
def test_verify_over_int8(form: str) -> None:
    """paged_verify.py: rows of Q queries (last token + drafts, padded), written then attended."""
    pools = Pools.random(7)
    gen = torch.Generator().manual_seed(8)
    rows, nq = [(7, 3), (0, 1), (12, 2)], 3
    tables = _tables([c + n for c, n in rows], 5, seed=9)
    slots = torch.zeros(len(rows), nq, dtype=torch.int64)
    for r, (c, n) in enumerate(rows):
        slots[r, :n] = _slots(tables[r : r + 1].expand(n, -1), list(range(c, c + n)))
    meta = VerifyMetadata(
        slots,
        torch.tensor([c + n for c, n in rows], dtype=torch.int32),
        torch.tensor([n for _, n in rows], dtype=torch.int32),
        tables,
    )
    q, k, v = (torch.randn(len(rows) * nq, h, D, generator=gen) for h in (HQ, HKV, HKV))
    got = paged_verify.paged_verify_attention(q, k, v, pools.k8, pools.v8, meta, SCALE, scales=pools.scales)
    kr, vr = stored(k, torch.int8), stored(v, torch.int8)
    want = rotate(paged_verify.paged_verify_attention(rotate(q), kr, vr, pools.kf, pools.vf, meta, SCALE))
    if form != "matmul":  # a form torch.compile traces, over the caches just written
        attend = paged_verify._attend_fused if form == "fused" else paged_verify._attend_gathered
        got = attend(q, pools.k8, pools.v8, meta, SCALE, scales=pools.scales)
        want = attend(q, pools.kf, pools.vf, meta, SCALE)
    pools.assert_same_contents()
    for r, (_, n) in enumerate(rows):
        torch.testing.assert_close(got[r * nq : r * nq + n], want[r * nq : r * nq + n], **TOL)


@pytest.mark.compiled
def test_compiled_decode_over_int8_reads_and_writes_in_place() -> None:
    """torch.compile(fullgraph) of the graph-safe decode over an int8 pool: no graph break, the codes
    and scales written in place, the output as eager's."""
    pools = Pools.random(10)
    gen = torch.Generator().manual_seed(11)
    lens = [9, 3, 17]
    tables = _tables(lens, 5, seed=12)
    meta = DecodeMetadata(
        _slots(tables, [n - 1 for n in lens]), torch.tensor(lens, dtype=torch.int32), tables
    )
    q, k, v = (torch.randn(3, h, D, generator=gen) for h in (HQ, HKV, HKV))

    def step(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, sc: Scales
    ) -> torch.Tensor:
        return paged_decode.paged_decode_attention(q, k, v, k8, v8, meta, SCALE, scales=sc)

    eager = Pools.random(10)
    want = step(q, k, v, eager.k8, eager.v8, eager.scales)
    got = torch.compile(step, fullgraph=True, dynamic=False)(q, k, v, pools.k8, pools.v8, pools.scales)
    torch.testing.assert_close(got, want, **TOL)
    # traced and eager rotate by different float sums (kv_cache.rotate): a code may round the other
    # way at a .5, a scale differ in its last bits
    for a, b in ((pools.k8, eager.k8), (pools.v8, eager.v8)):
        assert (a.int() - b.int()).abs().max() <= 1
    for a, b in zip(pools.scales, eager.scales, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=1e-6)
