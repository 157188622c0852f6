"""rillet's paged attention for CPUs (kernels/paged_attention.cpp): `rillet::paged_attention`.

The compiled CPU decode and verify steps attended as two batched GEMMs a kv head over each row's
context, gathered out of the pool into a contiguous copy first, with the softmax and its mask as
Inductor's fused loops between them (paged_decode.py `gemms_over_context`). On the default model
that was 104-154 us a layer at batch 1 over 272 cached tokens (1 to 9 queries), ~40 % of a saved
16-query verify step (py-spy): the gather's copy, two GEMM calls too small to pay their set-up, and a
softmax loop Inductor parallelised over the batch's rows alone (one row: one thread). This kernel
reads each block of keys and values in place through the block table and keeps an online softmax
per query row (flash attention's recurrence, 16 keys at a time), the G query heads of a kv head
and a row's queries sharing each key's load: 21 / 28 / 51 us at 1 / 2 / 9 queries there
(`python -m bench.kernels.paged_attention`, bench/RESULTS.md 2026-12-05).

It is a torch custom op, so the compiled steps (torch.compile and the saved AOTInductor steps) call
it as an extern kernel. Built on first use by torch's extension builder (~10 s once) for AVX-512,
the width its 16-lane vectors are written for: where ATen's CPU capability is lower (a CPU without
AVX-512, or ATEN_CPU_CAPABILITY=avx2) the same source built for AVX2 ran 2-3x slower than the GEMM
path, so there, where it does not build, or where RILLET_ATTENTION_KERNEL=torch is set, the steps
keep the GEMM path. Not for an int8 pool (its scales and rotation stay on the torch path),
soft-capped scores (Gemma 2: paged_decode.py's reductions) or head sizes that are not a multiple
of 16.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import torch
from rillet.core.attention.base import DecodeMetadata, VerifyMetadata
from rillet.core.quant.build_lock import load_extension

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "kernels" / "paged_attention.cpp"
NAME = "rillet_paged_attention"  # its build folder under TORCH_EXTENSIONS_DIR
VARIANT = "paged-kernel"  # a backend's `variant` when its steps attend through this kernel
KERNEL_ENV = "RILLET_ATTENTION_KERNEL"  # "torch": keep the GEMM path (A/B benchmarks, a suspected bug)
DTYPES = (torch.float32, torch.bfloat16)
FLAGS = [
    "-mavx512f",
    "-mavx512vl",
    "-mavx512bw",
    "-mavx512dq",
    "-mavx2",
    "-mfma",
    "-mprefer-vector-width=512",
]
MAX_HEAD_DIM = 256  # as the kernel's kMaxD
MAX_GROUP = 64  # query heads per kv head: the kernel's kMaxRows


def enabled(head_dim: int, group: int, kv_dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a model's decode and verify steps attend through this kernel: a CPU model whose pool
    holds float32 or bfloat16, whose head size is a multiple of 16 (at most 256) and whose kv heads
    serve at most 64 query heads each, on a CPU whose ATen capability is AVX-512, unless the
    environment says no."""
    if os.environ.get(KERNEL_ENV, "auto") == "torch" or device.type != "cpu" or kv_dtype not in DTYPES:
        return False
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False
    return head_dim % 16 == 0 and head_dim <= MAX_HEAD_DIM and group <= MAX_GROUP and available()


@functools.cache
def available() -> bool:
    """Whether rillet::paged_attention is registered (built and loaded at the first call) and may
    run here (the CPU has AVX-512)."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512" or not torch.cpu._is_avx512_supported():
        return False  # ATen's cap caps it too (ATEN_CPU_CAPABILITY=avx2: what an AVX2 CPU runs)
    failed = load_extension(NAME, SOURCE, FLAGS)
    if failed is not None:
        log.warning("attention: rillet's paged attention kernel did not build (%s); using GEMMs", failed)
        return False
    torch.library.register_fake("rillet::paged_attention")(_fake)
    return True


def _fake(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: torch.Tensor,
    scale: float,
    window: int,
) -> torch.Tensor:
    return q.new_empty(q.shape)


def attend(
    q: torch.Tensor,  # [B, Q, Hq, D]
    k_cache: torch.Tensor,  # [N, bs, Hkv, D], this step's K/V already written
    v_cache: torch.Tensor,
    meta: DecodeMetadata | VerifyMetadata,  # a decode row: one query
    scale: float,
    window: int | None,
) -> torch.Tensor:  # [B, Q, Hq, D]
    """Query i of row b (position seq_lens[b] - query_lens[b] + i) over the row's keys up to its
    own position (its last `window` of them); padding queries see the whole context."""
    lens = meta.seq_lens
    query_lens = meta.query_lens if isinstance(meta, VerifyMetadata) else lens.new_ones(lens.shape[0])
    return torch.ops.rillet.paged_attention(  # type: ignore[no-any-return]
        q, k_cache, v_cache, meta.block_tables, lens, query_lens, scale, window or 0
    )
