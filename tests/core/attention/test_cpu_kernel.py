"""rillet's CPU paged attention kernel (attention/cpu_kernel.py) against the torch path it replaces
in the decode and verify steps (the matmul form, itself checked against SDPA in
test_paged_verify.py): grouped query heads, several queries a row causal among themselves, padding
rows and queries, sliding windows, bfloat16 pools, head sizes 16 to 128, context lengths across
block boundaries; a row's bits alone and in any batch; the op inside torch.compile's graph."""

from __future__ import annotations

import random

import pytest
import torch
from rillet.core.attention import cpu_kernel
from rillet.core.attention.base import DecodeMetadata, VerifyMetadata
from rillet.core.attention.paged_decode import paged_decode_attention
from rillet.core.attention.paged_verify import paged_verify_attention

pytestmark = pytest.mark.isa  # run again under an AVX2 cap (tests/test_isa_cap.py)

needs_kernel = pytest.mark.skipif(not cpu_kernel.available(), reason="no AVX-512 (or a cap), or no build")

BS, NUM_BLOCKS = 16, 48


class Rows:
    """Rows of (cached tokens, new tokens <= nq) over one shuffled pool, the new K/V not yet written."""

    def __init__(
        self, rows: list[tuple[int, int]], nq: int, hq: int, hkv: int, d: int, dtype: torch.dtype, seed: int
    ) -> None:
        gen = torch.Generator().manual_seed(seed)
        pool = list(range(1, NUM_BLOCKS))
        random.Random(seed).shuffle(pool)
        self.k_cache, self.v_cache = (
            torch.randn(NUM_BLOCKS, BS, hkv, d, generator=gen).to(dtype) for _ in "kv"
        )
        width = max(-(-(c + n) // BS) for c, n in rows) + 1
        self.tables = torch.zeros(len(rows), width, dtype=torch.int32)
        self.slots = torch.zeros(len(rows), nq, dtype=torch.int64)
        for r, (cached, new) in enumerate(rows):
            need = -(-(cached + new) // BS)
            table, pool = pool[:need], pool[need:]
            self.tables[r, :need] = torch.tensor(table)
            self.slots[r, :new] = torch.tensor(
                [table[p // BS] * BS + p % BS for p in range(cached, cached + new)]
            )
        self.q = torch.randn(len(rows) * nq, hq, d, generator=gen).to(dtype)
        self.k, self.v = (torch.randn(len(rows) * nq, hkv, d, generator=gen).to(dtype) for _ in "kv")
        self.seq_lens = torch.tensor([c + n for c, n in rows], dtype=torch.int32)
        self.query_lens = torch.tensor([n for _, n in rows], dtype=torch.int32)
        self.nq, self.d = nq, d

    def verify(self, kernel: bool, window: int | None = None) -> torch.Tensor:  # [B * Q, Hq, D]
        meta = VerifyMetadata(self.slots, self.seq_lens, self.query_lens, self.tables)
        kc, vc = self.k_cache.clone(), self.v_cache.clone()
        scale = self.d**-0.5
        return paged_verify_attention(
            self.q, self.k, self.v, kc, vc, meta, scale, window=window, kernel=kernel
        )

    def decode(self, kernel: bool, window: int | None = None) -> torch.Tensor:  # [B, Hq, D] (nq == 1)
        meta = DecodeMetadata(self.slots[:, 0], self.seq_lens, self.tables)
        kc, vc = self.k_cache.clone(), self.v_cache.clone()
        return paged_decode_attention(
            self.q, self.k, self.v, kc, vc, meta, self.d**-0.5, window=window, kernel=kernel
        )


def real(out: torch.Tensor, rows: list[tuple[int, int]], nq: int) -> list[torch.Tensor]:
    return [out[r * nq : r * nq + n] for r, (_, n) in enumerate(rows)]


def close(got: list[torch.Tensor], want: list[torch.Tensor], dtype: torch.dtype) -> None:
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 0.02, "atol": 0.02}
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **tol)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hq", "hkv", "d"), [(9, 3, 64), (4, 4, 16), (8, 2, 80), (2, 1, 128)])
def test_verify_rows_match_the_torch_path(hq: int, hkv: int, d: int, dtype: torch.dtype) -> None:
    rows = [(30, 5), (0, 1), (15, 2), (47, 4), (16, 5)]  # block edges, a fresh one-token row
    x = Rows(rows, 5, hq, hkv, d, dtype, seed=hq + d)
    out = x.verify(kernel=True)
    close(real(out, rows, 5), real(x.verify(kernel=False), rows, 5), dtype)
    assert torch.isfinite(out).all()  # padding queries see their row's whole context


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_rows_match_the_torch_path(dtype: torch.dtype) -> None:
    rows = [(0, 1), (15, 1), (16, 1), (200, 1), (33, 1)]
    x = Rows(rows, 1, 9, 3, 64, dtype, seed=1)
    close([x.decode(kernel=True)], [x.decode(kernel=False)], dtype)


@needs_kernel
@pytest.mark.parametrize("window", [1, 4, 20])
def test_sliding_windows(window: int) -> None:
    rows = [(40, 3), (2, 2), (25, 4)]
    x = Rows(rows, 4, 4, 2, 32, torch.float32, seed=window)
    close(real(x.verify(True, window), rows, 4), real(x.verify(False, window), rows, 4), torch.float32)
    d = Rows([(40, 1), (3, 1)], 1, 4, 2, 32, torch.float32, seed=window)
    close([d.decode(True, window)], [d.decode(False, window)], torch.float32)


@needs_kernel
def test_a_rows_bits_do_not_depend_on_its_batch() -> None:
    """The same row alone, first in a batch and last in a longer one; as a decode row and as a
    verify row's first query: equal to the bit (the kernel splits work over rows, heads and query
    chunks, never inside one query's sums)."""
    rows = [(100, 6), (7, 2), (60, 6), (33, 1)]
    x = Rows(rows, 6, 9, 3, 64, torch.float32, seed=5)
    full = real(x.verify(True), rows, 6)
    for idx in range(len(rows)):
        one = Rows(rows, 6, 9, 3, 64, torch.float32, seed=5)
        keep = slice(idx, idx + 1)
        one.q, one.k, one.v = (
            t.view(len(rows), 6, *t.shape[1:])[keep].flatten(0, 1) for t in (x.q, x.k, x.v)
        )
        one.slots, one.tables = x.slots[keep], x.tables[keep]
        one.seq_lens, one.query_lens = x.seq_lens[keep], x.query_lens[keep]
        assert torch.equal(real(one.verify(True), [rows[idx]], 6)[0], full[idx])
    # row 3 has one query: as a decode row its output is the verify row's to the bit
    dec = Rows([(c, 1) for c, _ in rows], 1, 9, 3, 64, torch.float32, seed=5)
    dec.q, dec.k, dec.v = (t.view(len(rows), 6, *t.shape[1:])[:, 0] for t in (x.q, x.k, x.v))
    dec.slots, dec.tables, dec.seq_lens = x.slots[:, :1], x.tables, x.seq_lens
    assert torch.equal(dec.decode(True)[3], full[3][0])


@needs_kernel
def test_inside_a_compiled_graph() -> None:
    """The op traced with fullgraph and dynamic shapes (as the compiled CPU steps are): the same
    output as eager, for a batch size and a query count other than the first call's."""
    hq, hkv, d = 4, 2, 16

    def step(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, *meta: torch.Tensor) -> torch.Tensor:
        tables, lens, qlens = meta
        slots = lens.new_zeros(0)  # unread: the kernel writes no K/V
        return cpu_kernel.attend(q, kc, vc, VerifyMetadata(slots, lens, qlens, tables), d**-0.5, None) * 2

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for rows, nq in [([(20, 3), (5, 2)], 3), ([(40, 5), (9, 1), (17, 4)], 5)]:
        x = Rows(rows, nq, hq, hkv, d, torch.float32, seed=nq)
        args = (x.q.view(len(rows), nq, hq, d), x.k_cache, x.v_cache, x.tables, x.seq_lens, x.query_lens)
        assert torch.equal(compiled(*args), step(*args))


@needs_kernel
def test_bad_shapes_are_refused() -> None:
    x = Rows([(10, 2)], 2, 4, 2, 16, torch.float32, seed=0)
    q = x.q.view(1, 2, 4, 16)
    meta = VerifyMetadata(x.slots, x.seq_lens, x.query_lens, x.tables)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        cpu_kernel.attend(q[..., :8], x.k_cache[..., :8], x.v_cache[..., :8], meta, 1.0, None)
    short = VerifyMetadata(x.slots, x.seq_lens, x.query_lens[:0], x.tables)
    with pytest.raises(RuntimeError, match="one per row"):
        cpu_kernel.attend(q, x.k_cache, x.v_cache, short, 1.0, None)
    long = VerifyMetadata(x.slots, x.seq_lens + 100, x.query_lens, x.tables)
    with pytest.raises(RuntimeError, match="outside its block table"):
        cpu_kernel.attend(q, x.k_cache, x.v_cache, long, 1.0, None)
    stray = VerifyMetadata(x.slots, x.seq_lens, x.query_lens, x.tables + NUM_BLOCKS)
    with pytest.raises(RuntimeError, match="outside the pool"):
        cpu_kernel.attend(q, x.k_cache, x.v_cache, stray, 1.0, None)
    cpu = torch.device("cpu")
    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        assert cpu_kernel.enabled(64, 3, torch.bfloat16, cpu)
    assert not cpu_kernel.enabled(64, 3, torch.int8, cpu)  # an int8 pool keeps the torch path
    assert not cpu_kernel.enabled(72, 3, torch.float32, cpu)
    assert not cpu_kernel.enabled(64, 71, torch.float32, cpu)


def test_a_failed_build_keeps_the_gemm_path(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No compiler, no ninja, a compile error: a warning, and the kernel is not used."""
    from torch.utils import cpp_extension

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Error building extension 'rillet_paged_attention'")

    monkeypatch.setattr(cpp_extension, "load", fail)
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    with caplog.at_level("WARNING", logger="rillet.core.attention.cpu_kernel"):
        assert cpu_kernel.available.__wrapped__() is False
    assert [r.levelname for r in caplog.records if r.name == "rillet.core.attention.cpu_kernel"] == [
        "WARNING"
    ]


def test_atens_cpu_cap_keeps_the_gemm_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ATEN_CPU_CAPABILITY=avx2 the process runs what a CPU without AVX-512 runs: no build is
    tried, and the steps keep the GEMM path."""
    from torch.utils import cpp_extension

    def build(*args: object, **kwargs: object) -> None:
        raise AssertionError("no build under an AVX2 cap")

    monkeypatch.setattr(cpp_extension, "load", build)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert cpu_kernel.available.__wrapped__() is False
    assert not cpu_kernel.enabled(64, 3, torch.float32, torch.device("cpu"))


@needs_kernel
def test_a_bfloat16_pool_under_float32_queries() -> None:
    """The default CPU model's layout when the pool is bfloat16 (cache.dtype) and activations are
    float32: keys and values widened as they are read."""
    rows = [(30, 3), (5, 1)]
    x = Rows(rows, 3, 9, 3, 64, torch.float32, seed=9)
    x.k_cache, x.v_cache = x.k_cache.bfloat16(), x.v_cache.bfloat16()
    out = x.verify(kernel=True)
    assert out.dtype == torch.float32
    close(real(out, rows, 3), real(x.verify(kernel=False), rows, 3), torch.float32)
