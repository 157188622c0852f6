"""rillet's int4 kernel (core/quant/rows_kernel.py, kernels/int4_rows.cpp) against torch's.

The same Int4Weight codes laid out for either kernel give the same products to bf16 rounding at
every row count (the kernel's row passes and tile pairs), equal the float32 product of the
dequantized weight, and run inside torch.compile without a graph break and inside a saved
AOTInductor step (its custom op's extern nodes beside the library)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rillet.core.quant import rows_kernel
from rillet.core.quant.int4 import Int4Weight, int4_supported
from rillet.graphs.aot.export import build_library
from rillet.graphs.aot.key import make_key
from rillet.graphs.aot.step import load_library
from rillet.graphs.aot.store import EXTERN, ArtifactStore
from torch import nn

needs_kernel = pytest.mark.skipif(
    not (int4_supported() and rows_kernel.available()), reason="needs AVX512-BF16 and a C++ compiler"
)

SHAPES = [(32, 32), (64, 96), (1536, 576), (576, 1536)]  # [N, K]
ROWS = [0, 1, 2, 3, 5, 8, 9, 17]  # around the kernel's passes of 8 rows


def _pair(n: int, k: int, seed: int = 0) -> tuple[Int4Weight, Int4Weight, torch.Tensor]:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    return Int4Weight(w, rows=True), Int4Weight(w, rows=False), w


def _dequantized(w: torch.Tensor) -> torch.Tensor:  # what Int4Weight's codes stand for, float32
    g = w.float().reshape(w.shape[0], -1, 32)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    q = ((g - lo) / scale).round().clamp(0, 15)
    s, z = scale.bfloat16().float(), (lo + 8 * scale).bfloat16().float()
    return ((q - 8) * s + z).reshape(w.shape)


@needs_kernel
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_same_products_as_torchs_kernel_at_every_row_count(n: int, k: int) -> None:
    rows, aten, w = _pair(n, k)
    assert rows.rows and not aten.rows
    for m in ROWS:
        x = torch.randn(m, k)
        got, want = rows(x), aten(x)
        assert got.dtype == torch.bfloat16 and got.shape == (m, n)
        exact = x.bfloat16().float() @ _dequantized(w).t()  # [M, N] float32
        scale = exact.abs().max().item() if m else 1.0
        # both round a float32 sum to bf16 (2^-8 relative); they sum in other orders
        torch.testing.assert_close(got.float(), want.float(), atol=scale * 2**-7, rtol=0)
        torch.testing.assert_close(got.float(), exact, atol=scale * 2**-7, rtol=0)


@needs_kernel
def test_a_row_gets_the_same_bits_alone_and_in_a_batch() -> None:
    """Each row's sums run in the same order whatever the batch (batch invariance: greedy
    speculative decoding and deterministic mode compare a row's logits across batch sizes)."""
    rows, _, _ = _pair(1536, 576)
    x = torch.randn(40, 576)  # past a pass of 12 (AVX512) and of 16 rows (AMX)
    batch = rows(x)
    for i in (0, 7, 8, 12, 16, 17, 39):
        assert torch.equal(rows(x[i : i + 1]), batch[i : i + 1])


needs_amx = pytest.mark.skipif(
    not (int4_supported() and rows_kernel.available() and rows_kernel.has_amx()), reason="needs AMX tiles"
)


@needs_amx
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_amx_tiles_give_the_avx512_paths_products(n: int, k: int) -> None:
    """The tile path sums each group's exact pair products as vdpbf16ps does (a pair's two in the
    other order: to the last bit), across its passes of 16 rows too; `mm` takes the tiles at every
    row count where the CPU has them."""
    w = Int4Weight(torch.randn(n, k, generator=torch.Generator().manual_seed(3)), rows=True)
    for m in [0, 1, 2, 3, 5, 8, 9, 15, 16, 17, 31, 32, 33, 100]:
        x = torch.randn(m, k).bfloat16()
        tiles = rows_kernel.mm_with(x, w.packed, w.scales_zeros, n, amx=True)
        vectors = rows_kernel.mm_with(x, w.packed, w.scales_zeros, n, amx=False)
        assert torch.equal(rows_kernel.mm(x, w.packed, w.scales_zeros, n), tiles)
        scale = vectors.float().abs().max().item() if m else 1.0
        torch.testing.assert_close(tiles.float(), vectors.float(), atol=scale * 2**-7, rtol=0)


@needs_kernel
@pytest.mark.skipif(rows_kernel.has_amx(), reason="a CPU without AMX tiles")
def test_asking_for_tiles_without_amx_is_an_error() -> None:
    w = Int4Weight(torch.randn(64, 64), rows=True)
    with pytest.raises(RuntimeError, match="AMX"):
        rows_kernel.mm_with(torch.randn(2, 64).bfloat16(), w.packed, w.scales_zeros, 64, amx=True)


@needs_kernel
def test_an_aten_copy_gives_torchs_products_while_use_aten_is_set() -> None:
    """Where the CPU has AMX tiles the codes keep torch's layout too: the small-batch step is traced
    through torch's kernel (DecoderModel.torch_int4_kernel), the others through rillet's."""
    w = torch.randn(1536, 576, generator=torch.Generator().manual_seed(4))
    both, aten = Int4Weight(w, rows=True, aten_copy=True), Int4Weight(w, rows=False)
    plain = Int4Weight(w, rows=True, aten_copy=False)
    assert both.aten_packed is not None and plain.aten_packed is None
    x = torch.randn(3, 576)
    rillet = plain(x)
    assert torch.equal(both(x), rillet)
    both.use_aten = plain.use_aten = True
    assert torch.equal(both(x), aten(x))
    assert torch.equal(plain(x), rillet)  # no copy: rillet's kernel still


@pytest.mark.parametrize(
    ("choice", "amx", "want"), [("auto", True, True), ("auto", False, False), ("rillet", True, False)]
)
def test_the_aten_copy_is_kept_where_the_cpu_has_amx(
    monkeypatch: pytest.MonkeyPatch, choice: str, amx: bool, want: bool
) -> None:
    monkeypatch.setenv(rows_kernel.KERNEL_ENV, choice)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert rows_kernel.keeps_aten_copy() is want


@needs_kernel
def test_shapes_the_kernel_does_not_tile_keep_torchs_layout() -> None:
    w = Int4Weight(torch.randn(48, 64))  # 48 columns: not a whole tile pair of 32
    assert not w.rows
    assert w(torch.randn(3, 64)).shape == (3, 48)


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = Int4Weight(torch.randn(128, 64, generator=torch.Generator().manual_seed(1)), rows=True)
        self.down = Int4Weight(torch.randn(64, 128, generator=torch.Generator().manual_seed(2)), rows=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [M, 64] -> [M, 64]
        return self.down(torch.relu(self.up(x)).float()).float()


@needs_kernel
@pytest.mark.compiled
def test_compiled_without_a_graph_break_equals_eager() -> None:
    m = _Mlp()
    x = torch.randn(5, 64)
    compiled = torch.compile(m, fullgraph=True, dynamic=True)
    torch.testing.assert_close(compiled(x), m(x), atol=0, rtol=0)
    torch.testing.assert_close(compiled(x[:2]), m(x[:2]), atol=0, rtol=0)


@needs_kernel
@pytest.mark.compiled
@pytest.mark.artifacts
def test_a_saved_step_calls_the_kernel_through_its_extern_nodes(tmp_path: Path) -> None:
    m = _Mlp().eval()
    x = torch.randn(5, 64)
    rows = torch.export.Dim("rows", min=1, max=64)
    with torch.inference_mode():
        program = torch.export.export(m, (x,), dynamic_shapes=({0: rows},), strict=False)
    library = build_library(program, "default", None, tmp_path)
    assert library.with_suffix(".json").exists()
    store = ArtifactStore(tmp_path / "store")
    saved = store.save(make_key("decode", "w", "c", "m"), library, 1.0)
    assert (saved.parent / EXTERN).exists()
    run, _ = load_library(saved)
    for batch in (x, x[:1]):
        torch.testing.assert_close(run(batch)[0], m(batch), atol=0, rtol=0)


def test_a_failed_build_leaves_torchs_kernel(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No compiler, no ninja, a compile error: a warning, and Int4Weight keeps torch's layout."""
    from torch.utils import cpp_extension

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Error building extension 'rillet_int4_rows'")

    monkeypatch.setattr(cpp_extension, "load", fail)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    with caplog.at_level("WARNING", logger="rillet.core.quant.rows_kernel"):
        assert rows_kernel.available.__wrapped__() is False
    assert [r.levelname for r in caplog.records if r.name == "rillet.core.quant.rows_kernel"] == ["WARNING"]


@pytest.mark.parametrize(
    ("choice", "runs", "amx", "want"),
    [
        ("auto", True, False, True),  # AVX512-BF16 without AMX: the kernel
        ("auto", True, True, True),  # AMX: the kernel, through tiles from 2 rows
        ("rillet", True, True, True),
        ("rillet", False, False, False),  # asked for where it cannot run: torch's
        ("aten", True, False, False),
    ],
)
def test_the_environment_chooses_the_kernel(
    monkeypatch: pytest.MonkeyPatch, choice: str, runs: bool, amx: bool, want: bool
) -> None:
    monkeypatch.setenv(rows_kernel.KERNEL_ENV, choice)
    monkeypatch.setattr(rows_kernel, "available", lambda: runs)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert rows_kernel.enabled() is want
