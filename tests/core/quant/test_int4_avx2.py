"""rillet's AVX2 int4 kernel (core/quant/avx2_kernel.py, kernels/int4_avx2.cpp): two-level int8
activations times the int4 codes, against the dequantized float32 product and torch's kernel; a row's bits
alone and in a batch; which kernel Int4Weight picks; a compiled graph calling it (no break)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rillet.core.quant import avx2_kernel, rows_kernel
from rillet.core.quant.int4 import Int4Weight, Int8Weight, int4_supported
from rillet.core.quant.int4_candidates import AVX2_MAX_ROWS, Int4Candidates
from torch import nn

pytestmark = pytest.mark.isa  # run again under an AVX2 cap (tests/test_isa_cap.py): where it is chosen

needs_kernel = pytest.mark.skipif(
    not (int4_supported() and avx2_kernel.available()), reason="needs AVX2 and a C++ compiler"
)

SHAPES = [(8, 32), (64, 96), (1536, 576), (576, 1536)]  # [N, K]
ROWS = [0, 1, 2, 3, 5, 8, 9, 17]  # around the kernel's passes of 8 rows


def _parts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What Int4Weight's codes stand for, float32 [N, K]: ((q - 8) * s, z) per element."""
    g = w.float().reshape(w.shape[0], -1, 32)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    q = ((g - lo) / scale).round().clamp(0, 15)
    s, z = scale.bfloat16().float(), (lo + 8 * scale).bfloat16().float()
    return ((q - 8) * s).reshape(w.shape), z.expand_as(g).reshape(w.shape)


def _bound(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float32, w [N, K] -> (the float32 product of the dequantized weight, the most the
    kernel may differ from it). Each input is rounded to a multiple of its group's second-level
    step dx / 254 (dx = max|x| / 127), by at most dx / 508, and only the (q - 8) * s part
    multiplies the rounded inputs (the zeros multiply the exact group sums); then fp32 sums and
    one bf16 rounding."""
    wq, z = _parts(w)
    exact = x @ (wq + z).t()
    step = x.abs().reshape(len(x), x.shape[1] // 32, 32).amax(-1) / 127  # [M, K/G]
    dx = step.repeat_interleave(32, 1)  # [M, K]
    rounding = (dx / 508) @ wq.abs().t() * 1.01  # 1 %: the fp32 step dx and x / dx themselves
    fp32 = x.abs() @ (wq.abs() + z.abs()).t() * 2**-14  # K * 2^-24, K < 1024
    return exact, rounding + fp32 + exact.abs() * 2**-8


@needs_kernel
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_products_within_the_int8_steps_of_the_dequantized_weight(n: int, k: int, dtype: torch.dtype) -> None:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k))
    ours = Int4Weight(w, avx2=True)
    assert ours.avx2 and not ours.rows
    aten = Int4Weight(w, rows=False) if n % 16 == 0 else None  # torch's layout takes N in 16s
    for m in ROWS:
        x = torch.randn(m, k).to(dtype)
        got = ours(x)
        assert got.dtype == torch.bfloat16 and got.shape == (m, n)
        exact, bound = _bound(x.float(), w)
        assert ((got.float() - exact).abs() <= bound).all()
        if aten is not None:  # torch's: bf16 inputs (2^-9 each), fp32 sums, one bf16 rounding
            theirs = aten(x).float()
            inputs = x.float().abs() @ w.abs().t() * 2**-8  # w's magnitudes stand in for the codes'
            assert ((got.float() - theirs).abs() <= bound + inputs + exact.abs() * 2**-7).all()


@needs_kernel
def test_a_row_gets_the_same_bits_alone_and_in_a_batch() -> None:
    """Each row is quantized and summed in one order whatever the batch (batch invariance: greedy
    speculative decoding and deterministic mode compare a row's logits across batch sizes)."""
    w = Int4Weight(torch.randn(1536, 576), avx2=True)
    x = torch.randn(17, 576)
    batch = w(x)
    for i in (0, 3, 4, 5, 8, 16):
        assert torch.equal(w(x[i : i + 1]), batch[i : i + 1])


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An AVX2 CPU whose kernel built, as far as Int4Weight's choice goes; tests change parts."""
    monkeypatch.delenv(rows_kernel.KERNEL_ENV, raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(rows_kernel, "enabled", lambda: False)
    monkeypatch.setattr(avx2_kernel, "available", lambda: True)
    return monkeypatch


def _kernel(w: Int4Weight) -> str:
    return "rows" if w.rows else "avx2" if w.avx2 else "aten"


def test_int4_weight_takes_it_where_the_capability_is_avx2(cpu: pytest.MonkeyPatch) -> None:
    assert _kernel(Int4Weight(torch.randn(64, 64))) == "avx2"
    assert _kernel(Int4Weight(torch.randn(64, 64), rows=False)) == "aten"  # asked for torch's layout


@pytest.mark.parametrize(
    ("capability", "env", "rows", "want"),
    [
        ("AVX512", "auto", False, "aten"),  # AVX-512 (without BF16): torch's
        ("AVX512", "rillet", False, "avx2"),  # asked for: wherever it runs
        ("AVX512", "auto", True, "rows"),  # AVX512-BF16: the rows kernel, never this one
        ("AVX2", "aten", False, "aten"),
        ("AVX2", "rillet", False, "avx2"),
    ],
)
def test_the_capability_and_the_environment_choose(
    cpu: pytest.MonkeyPatch, capability: str, env: str, rows: bool, want: str
) -> None:
    cpu.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    cpu.setenv(rows_kernel.KERNEL_ENV, env)
    cpu.setattr(rows_kernel, "enabled", lambda: rows)
    assert avx2_kernel.enabled() is (want == "avx2")


def test_a_failed_build_leaves_torchs_kernel(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No compiler, no ninja, a compile error: one warning, and Int4Weight keeps torch's layout."""
    from torch.utils import cpp_extension

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Error building extension 'rillet_int4_avx2'")

    monkeypatch.setattr(cpp_extension, "load", fail)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    with caplog.at_level("WARNING", logger="rillet.core.quant.avx2_kernel"):
        assert avx2_kernel.available.__wrapped__() is False
    assert [r.levelname for r in caplog.records if r.name == "rillet.core.quant.avx2_kernel"] == ["WARNING"]
    monkeypatch.setattr(avx2_kernel, "available", lambda: False)
    monkeypatch.setattr(rows_kernel, "enabled", lambda: False)
    assert _kernel(Int4Weight(torch.randn(64, 64))) == "aten"


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = Int4Weight(torch.randn(128, 64, generator=torch.Generator().manual_seed(1)), avx2=True)
        self.down = Int4Weight(torch.randn(64, 128, generator=torch.Generator().manual_seed(2)), avx2=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [M, 64] -> [M, 64]
        return self.down(torch.relu(self.up(x)).float()).float()


@needs_kernel
@pytest.mark.compiled
def test_compiled_without_a_graph_break_equals_eager(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Inductor's cache key leaves ATen's cap out (graphs/compile_modes.py set_compile_cache_dir): an
    # entry an uncapped run wrote gave NaN under the AVX2 cap
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    m = _Mlp()
    x = torch.randn(5, 64)
    compiled = torch.compile(m, fullgraph=True, dynamic=True)
    torch.testing.assert_close(compiled(x), m(x), atol=0, rtol=0)
    torch.testing.assert_close(compiled(x[:2]), m(x[:2]), atol=0, rtol=0)


@needs_kernel
def test_the_heads_candidate_pass_takes_it_for_every_decode_batch() -> None:
    """Where it is the int4 kernel, the LM head's candidate pass goes through it up to 64 rows
    (int4_candidates.py), its logits within the spread candidates are picked from, each row's
    the same bits alone and in a batch."""
    head = Int8Weight(torch.randn(2048, 576, generator=torch.Generator().manual_seed(5)) * 0.05)
    int4 = Int4Candidates(head.codes, head.scales, avx2=True)
    assert int4.takes(1) and int4.takes(AVX2_MAX_ROWS) and not int4.takes(AVX2_MAX_ROWS + 1)
    x = torch.randn(9, 576, generator=torch.Generator().manual_seed(6))
    w = (head.codes.double() * head.scales.double()[..., None]).flatten(1)
    exact = x.double() @ w.t()
    got = int4(x)
    err, spread = (got.double() - exact).abs(), exact.std(1, keepdim=True)
    assert (err.mean(1, keepdim=True) < 0.1 * spread).all() and (err < 0.5 * spread).all()
    assert all(torch.equal(int4(x[i : i + 1]), got[i : i + 1]) for i in range(9))
