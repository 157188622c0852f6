"""rillet's own int4 matmul for CPUs with AVX512-BF16 (kernels/int4_rows.cpp): `rillet::int4_rows_mm`.

torch's `_weight_int4pack_mm_for_cpu` (and Inductor's AVX-512 weight-only int4 template) unpack
every weight again for each block of 4 activation rows and are compute-bound past one row, so a
speculative verify step of 5 query rows cost ~2 decode steps. This kernel unpacks each weight once
per pass of up to 12 rows, with a 16-entry lookup to the exact bf16 value q - 8, and feeds every
row's bf16 input pairs to vdpbf16ps against it, applying the group's scale and zero to the fp32
sums (w = (q - 8) * s + z: sum w x = s * sum (q - 8) x + z * sum x). One [1536, 576] matrix, out
of cache, one Zen 5 core (`python -m bench.kernels.int4_rows`, 2026-12-04): 32 / 50 / 76 / 95 /
174 us at 1 / 4 / 5 / 8 / 16 rows through torch's kernel, 24 / 31 / 35 / 48 / 94 through this
one; the outputs are the same to bf16 rounding (tests/core/quant/test_int4_rows.py). Where the
CPU has AMX tiles, rows go through tile multiplies (`preferred`).

It is a torch custom op, so torch.compile and AOTInductor call it as an extern kernel inside the
compiled step (no graph break). The C++ source is compiled on first use by torch's extension
builder (g++ and ninja; cached under TORCH_EXTENSIONS_DIR, ~25 s once). Where the CPU lacks
AVX512-BF16, the build fails or RILLET_INT4_KERNEL=aten is set, Int4Weight keeps torch's kernel.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import torch
from rillet.core.quant.build_lock import load_extension

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "kernels" / "int4_rows.cpp"
NAME = "rillet_int4_rows"  # the extension's name: its build folder under TORCH_EXTENSIONS_DIR
TILE = 32  # output columns per tile pair of the packed layout
GROUP = 32  # inputs per scale and zero
# "aten": keep torch's kernel (A/B benchmarks, a suspected bug); "rillet": this one wherever it
# runs; "auto" (default): where `preferred`
KERNEL_ENV = "RILLET_INT4_KERNEL"


def enabled() -> bool:
    """Whether new Int4Weights lay their codes out for this kernel: where it is preferred, unless
    the environment asks for torch's; wherever it runs when the environment asks for it (read at
    each call: tests and benchmarks switch it)."""
    choice = os.environ.get(KERNEL_ENV, "auto")
    return available() if choice == "rillet" else choice != "aten" and preferred()


def preferred() -> bool:
    """It runs here. Where the CPU has AMX tiles it multiplies through them (kernels/int4_rows.cpp),
    so a verify step's query rows cost little more than one: on a 2-core AMX Xeon one [1536, 576]
    matrix took 34 / 36 / 45 / 50 us at 2 / 5 / 9 / 16 rows against torch's 45 / 98 / 146 / 184
    (bench/RESULTS.md, 2026-12-04). Before the tiles this kernel's vdpbf16ps were compute-bound
    per row there, as torch's kernel is, and AMX CPUs kept torch's. There a single row still
    takes torch's kernel, in the small-batch step (Int4Weight's aten copy)."""
    return available()


def keeps_aten_copy() -> bool:
    """Whether an Int4Weight in this kernel's layout keeps torch's layout too (Int4Weight): where
    the kernel runs by default and the CPU has AMX tiles (not when the environment forces it)."""
    return os.environ.get(KERNEL_ENV, "auto") == "auto" and torch.cpu._is_amx_tile_supported()


@functools.cache
def available() -> bool:
    """Whether rillet::int4_rows_mm is registered and may run here (built and loaded at first call).
    ATen's CPU capability caps it as it caps torch's own kernels and Inductor's: a process under
    ATEN_CPU_CAPABILITY=avx2 runs what a CPU without AVX-512 runs (tests/test_isa_cap.py)."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512" or not torch.cpu._is_avx512_bf16_supported():
        return False
    failed = load_extension(NAME, SOURCE)
    if failed is not None:
        log.warning("int4: rillet's kernel did not build (%s); using torch's", failed)
        return False
    torch.library.register_fake("rillet::int4_rows_mm")(_fake)
    torch.library.register_fake("rillet::int4_rows_mm_with")(_fake_with)
    return True


def _fake(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, n: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], n)


def _fake_with(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, n: int, amx: bool) -> torch.Tensor:
    return x.new_empty(x.shape[0], n)


def fits(n: int, k: int) -> bool:
    return n % TILE == 0 and k % GROUP == 0


def runs(device_type: str, n: int, k: int) -> bool:
    """Whether an [n, k] int4 weight on this device goes through this kernel by default."""
    return device_type == "cpu" and fits(n, k) and enabled()


def pack(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes [N, K/G, G] in [0, 15], scale and zero [N, K/G] -> (packed [N/32, K/32, 16, 32] uint8,
    sz [N/32, K/32, 2, 32] bf16): the layout kernels/int4_rows.cpp reads, for w = (q - 8) * s + z."""
    n, g = scale.shape
    # [N, K/G, G] -> [T, 32, G, P, 2] -> [T, G, P, 32, 2]: tile pair, group, input pair, column, nibble
    c = codes.to(torch.uint8).view(n // TILE, TILE, g, GROUP // 2, 2).permute(0, 2, 3, 1, 4)
    packed = (c[..., 0] | (c[..., 1] << 4)).contiguous()
    per_tile = [v.to(torch.bfloat16).view(n // TILE, TILE, g).transpose(1, 2) for v in (scale, zero)]
    return packed, torch.stack(per_tile, 2).contiguous()


def mm(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, n: int) -> torch.Tensor:
    """x [M, K] bf16 -> [M, N] bf16 (through AMX tiles where the CPU has them)."""
    return torch.ops.rillet.int4_rows_mm(x, packed, sz, n)  # type: ignore[no-any-return]


def mm_with(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, n: int, amx: bool) -> torch.Tensor:
    """`mm` through the path named: AMX tiles (raises where the CPU has none) or AVX512-BF16 alone."""
    return torch.ops.rillet.int4_rows_mm_with(x, packed, sz, n, amx)  # type: ignore[no-any-return]


def has_amx() -> bool:
    """Whether `mm` takes AMX tiles here (the CPU has them and Linux lets this process use them)."""
    return bool(torch.cpu._is_amx_tile_supported() and torch.cpu._init_amx())
