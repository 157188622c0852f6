"""The LM head's int4 candidate pass for few rows (core/quant/int4_candidates.py): which rows take
it, its error, a row's bits alone and in a batch, and the exact argmax through it."""

from __future__ import annotations

import pytest
import torch
from rillet.core.quant import int4_candidates, rows_kernel
from rillet.core.quant.int4 import Int8Weight, int4_supported
from rillet.core.quant.int4_candidates import MAX_ROWS, ROWS_PER_THREAD, Int4Candidates

pytestmark = pytest.mark.skipif(
    not (int4_supported() and rows_kernel.available()), reason="no rillet int4 kernel on this CPU"
)


def _head(n: int = 2048, k: int = 96, seed: int = 0) -> Int8Weight:
    return Int8Weight(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05)


def _exact(head: Int8Weight, x: torch.Tensor) -> torch.Tensor:  # [M, N] float64: the int8 weights' logits
    w = (head.codes.double() * head.scales.double()[..., None]).flatten(1)
    return x.double() @ w.t()


def test_a_head_gets_one_where_the_kernel_runs_and_none_when_torchs_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert isinstance(_head().int4_candidates, Int4Candidates)
    monkeypatch.setenv(rows_kernel.KERNEL_ENV, "aten")
    assert _head().int4_candidates is None
    monkeypatch.delenv(rows_kernel.KERNEL_ENV)
    odd = Int8Weight(torch.randn(2048 + 16, 96) * 0.05)  # rows not in the kernel's 32-column tiles
    assert odd.int4_candidates is None


def test_few_rows_take_it_and_more_take_onednn_or_the_bf16_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    head = _head()
    int4 = head.int4_candidates
    assert int4 is not None
    limit = min(ROWS_PER_THREAD * torch.get_num_threads(), MAX_ROWS)
    assert int4.takes(1) and int4.takes(limit) and not int4.takes(limit + 1)
    seen: list[int] = []

    def spy(self: Int4Candidates, x: torch.Tensor) -> torch.Tensor:
        seen.append(len(x))
        return _exact(head, x).float()

    monkeypatch.setattr(Int4Candidates, "__call__", spy)
    x = torch.randn(limit + 1, 96, generator=torch.Generator().manual_seed(1))
    with monkeypatch.context() as m:  # many threads: no more rows than one pass of the kernel takes
        m.setattr(torch, "get_num_threads", lambda: 16)
        assert int4.takes(MAX_ROWS) and not int4.takes(MAX_ROWS + 1)
    head.approximate(x[:limit])
    head.approximate(x)
    assert seen == [limit]


def test_its_error_is_a_small_share_of_the_logits_spread() -> None:
    """Int4 codes of int8 weights: further off than oneDNN's int8 pass, still well inside the spread
    candidates are picked from (the default model's head: mean error 0.43, bench/RESULTS.md)."""
    head = _head(n=4096, k=576)
    assert head.int4_candidates is not None
    x = torch.randn(8, 576, generator=torch.Generator().manual_seed(3))
    exact = _exact(head, x)
    err = (head.int4_candidates(x).double() - exact).abs()
    spread = exact.std(1, keepdim=True)
    assert (err.mean(1, keepdim=True) < 0.1 * spread).all()
    assert (err < 0.5 * spread).all()


def test_a_rows_approximate_logits_are_the_same_bits_alone_and_in_a_batch() -> None:
    """The kernel sums each row in one order whatever the batch: a row's candidates change only
    where a batch crosses the row limit (to oneDNN's pass)."""
    int4 = _head().int4_candidates
    assert int4 is not None
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 96, generator=g) * torch.logspace(-2, 1, 8)[:, None]
    alone = torch.cat([int4(x[i : i + 1]) for i in range(8)])
    for m in (2, 5, 8):
        assert torch.equal(int4(x[:m]), alone[:m])
    perm = torch.randperm(8, generator=g)
    assert torch.equal(int4(x[perm]), alone[perm])


@pytest.mark.parametrize("cap", [None, 0.5])
def test_candidate_tokens_through_it_are_the_exact_argmax(cap: float | None) -> None:
    head = _head()
    assert head.int4_candidates is not None and head.int4_candidates.takes(4)
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(5))
    exact = _exact(head, x)
    got = head.candidate_tokens(x, cap=cap)
    assert torch.equal(got, exact.argmax(-1))
    logits = head.candidate_logits(x)
    assert torch.equal(logits.argmax(-1), exact.argmax(-1))
    finite = logits.isfinite()
    torch.testing.assert_close(logits[finite].double(), exact[finite], rtol=1e-6, atol=1e-6)


def test_build_quantizes_in_chunks_as_one_pass_would(monkeypatch: pytest.MonkeyPatch) -> None:
    """The head is requantized a chunk of rows at a time (no float32 copy of it whole): the same
    codes as one chunk."""
    head = _head(n=256)
    monkeypatch.setattr(int4_candidates, "_CHUNK", 64)
    chunked = int4_candidates.build(head.codes, head.scales)
    monkeypatch.setattr(int4_candidates, "_CHUNK", 4096)
    whole = int4_candidates.build(head.codes, head.scales)
    assert chunked is not None and whole is not None
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(6))
    assert torch.equal(chunked(x), whole(x))
