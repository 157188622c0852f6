"""rillet's int4 matmul for CPUs without AVX512-BF16 (kernels/int4_avx2.cpp): `rillet::int4_avx2_mm`.

Where the CPU has AVX2 but no AVX512-BF16 (AMD Zen 3, most Intel client CPUs), torch's
`_weight_int4pack_mm_for_cpu` takes bf16 activations that AVX2 widens in software, and Inductor's
weight-only int4 template is AVX-512 only, so the compiled decode step calls torch's kernel:
the default model decoded ~66 tok/s there against llama.cpp's ~70-75, which multiplies its
q4_1 codes by int8 activations (q8_1) with integer dot products. This kernel does the same, on
two int8 levels: each row's inputs are quantized per group of 32 to int8 (a step per group, the
group's float sum kept for the zeros) and their rest to int8 again at 1/254 of that step, and the
codes multiply both through vpmaddubsw / vpmaddwd, the scale and zero applied per group in fp32.
int8 alone (llama.cpp's) changed the default model's greedy answers under the AVX2 cap ("What is
the capital of France?" no longer said Paris; argmax agreement with float32 0.973, below
transformers bf16's 0.975); the second level puts the inputs within 1/508 of a step, closer than
bf16 operands. Outputs are within that of the dequantized float product
(tests/core/quant/test_int4_avx2.py); each row's sums run in one order whatever the batch. One
[1536, 576] matrix at 1 / 8 rows, one thread under the cap: 26 / 119 us against torch's 99 / 204
(`python -m bench.kernels.int4_avx2`, bench/RESULTS.md 2026-12-07); the head's candidate pass at
1 / 8 rows 0.71 / 3.6 ms against torch's int8 kernel's 3.0 / 9.5.

It is a torch custom op, so torch.compile and AOTInductor call it as an extern kernel inside the
compiled step (no graph break). Built on first use by torch's extension builder for AVX2 + FMA
(never -march=native: the build may be cached and run on another x86-64). It runs where ATen's
CPU capability is AVX2 (a CPU without AVX-512, or ATEN_CPU_CAPABILITY=avx2), never where
rillet's AVX512-BF16 kernel (rows_kernel.py) does. RILLET_INT4_KERNEL=aten keeps torch's kernel;
where the build fails, torch's kernel too (one warning).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import torch
from rillet.core.quant import rows_kernel
from rillet.core.quant.build_lock import load_extension

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "kernels" / "int4_avx2.cpp"
NAME = "rillet_int4_avx2"  # the extension's name: its build folder under TORCH_EXTENSIONS_DIR
FLAGS = ["-mavx2", "-mfma", "-mf16c"]
BLOCK = 8  # output columns per block of the packed layout (one fp32 vector)
GROUP = 32  # inputs per scale and zero
STEP = 8  # inputs per 32-byte load of a block's codes: 4 in the low nibbles, 4 in the high
CAPABILITIES = ("AVX2",)  # ATen's CPU capabilities where it is preferred to torch's kernel


def enabled() -> bool:
    """Whether new Int4Weights lay their codes out for this kernel: where ATen's capability is
    AVX2 and rillet's AVX512-BF16 kernel does not run, unless RILLET_INT4_KERNEL says aten; with
    RILLET_INT4_KERNEL=rillet wherever it runs and that one does not (read at each call: tests and
    benchmarks switch it)."""
    choice = os.environ.get(rows_kernel.KERNEL_ENV, "auto")
    if choice == "aten" or rows_kernel.enabled():
        return False
    return available() and (choice == "rillet" or preferred())


def preferred() -> bool:
    return torch.backends.cpu.get_cpu_capability() in CAPABILITIES


@functools.cache
def available() -> bool:
    """Whether rillet::int4_avx2_mm is registered and may run here (built and loaded at first call)."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False  # ATen's capability says the CPU (or the cap on it) has no AVX2
    failed = load_extension(NAME, SOURCE, FLAGS)
    if failed is not None:
        log.warning("int4: rillet's AVX2 kernel did not build (%s); using torch's", failed)
        return False
    torch.library.register_fake("rillet::int4_avx2_mm")(_fake)
    return True


def _fake(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, n: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], n, dtype=torch.bfloat16)


def fits(n: int, k: int) -> bool:
    return n % BLOCK == 0 and k % GROUP == 0


def runs(device_type: str, n: int, k: int) -> bool:
    """Whether an [n, k] int4 weight on this device goes through this kernel by default."""
    return device_type == "cpu" and fits(n, k) and enabled()


def pack(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes [N, K/G, G] in [0, 15], scale and zero [N, K/G] -> (packed [N/8, K/32, 4, 32] uint8,
    sz [N/8, K/32, 2, 8] bf16): the layout kernels/int4_avx2.cpp reads, for w = (q - 8) * s + z."""
    n, g = scale.shape
    # [N, K/G, G] -> [B, 8, G, P, 2, 4] -> [B, G, P, 8, 4, 2]: block, group, step, column, input, nibble
    c = codes.to(torch.uint8).view(n // BLOCK, BLOCK, g, GROUP // STEP, 2, STEP // 2)
    c = c.permute(0, 2, 3, 1, 5, 4)
    packed = (c[..., 0] | (c[..., 1] << 4)).reshape(n // BLOCK, g, GROUP // STEP, 32).contiguous()
    per_block = [v.to(torch.bfloat16).view(n // BLOCK, BLOCK, g).transpose(1, 2) for v in (scale, zero)]
    return packed, torch.stack(per_block, 2).contiguous()


def mm(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, n: int) -> torch.Tensor:
    """x [M, K] float32 or bf16 -> [M, N] bf16."""
    return torch.ops.rillet.int4_avx2_mm(x, packed, sz, n)  # type: ignore[no-any-return]
