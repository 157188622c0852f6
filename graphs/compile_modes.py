"""torch.compile's settings for the compiled decode step: its mode, Inductor's cache folder, the
dynamic dimensions of a batch (and the example sizes that keep them symbols), and the compile call
itself (graphs/compiled.py builds with them).

Modes starting with "max-autotune" freeze the weights on CPU (`freezes`): Inductor's CPU GEMM
templates only take weights it may treat as constants, and its weight-only int4 template
(an AVX-512 micro-kernel fused with the norm before it) beat aten's int4 kernel by 1.5-2x per
projection at one row (autotuned per shape at compile time against that kernel).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

import torch
from rillet.graphs.interface import DecodeBatch

logger = logging.getLogger(__name__)

StepFn = TypeVar("StepFn", bound=Callable[..., torch.Tensor])
DecodeFn = Callable[[DecodeBatch], torch.Tensor]

MIN_WIDTH = 2  # block-table columns; 1 would be specialised (a compile of its own)
COMPILE_ROWS, COMPILE_WIDTH = 2, 3  # example sizes: distinct, so dynamo keeps two symbols


def set_compile_cache_dir(base: Path) -> Path:
    """Points Inductor's on-disk caches at a folder of `base` per CPU-ISA cap, unless
    TORCHINDUCTOR_CACHE_DIR names another place than torch's default (torch itself writes its
    default there once it has looked).

    Inductor vectorises for the ISA that ATEN_CPU_CAPABILITY allows (AVX2 under `avx2`), but its
    FX-graph cache key leaves the cap out: a process without the cap then loads the AVX2 wrapper
    and builds its C++ for AVX-512, whose vectors are twice as wide as the loops step, and
    corrupts the heap (seen: "double free or corruption" in the first compiled step). One folder
    per cap keeps their entries apart."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current and os.path.abspath(current) != os.path.abspath(default_cache_dir()):
        return Path(current)
    path = base / f"isa-{os.environ.get('ATEN_CPU_CAPABILITY') or 'native'}"
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path


def resolve_compile_mode(requested: str, device: torch.device, int4_weights: bool) -> tuple[str, str]:
    """graphs.compile_mode -> (the torch.compile mode, why), for the start-up log. auto: the
    autotuned mode with frozen weights for a CPU model whose projections are weight-only int4
    (measured on the default model at batch 1: ~180 tok/s offline against 133-142 in mode default,
    whose int4 matmuls stay aten's kernel), "default" otherwise (the GPU path was measured with it)."""
    if requested != "auto":
        return requested, f"graphs.compile_mode {requested}"
    if device.type == "cpu" and int4_weights:
        why = "auto, CPU with int4 weights: Inductor's int4 GEMM template, autotuned, weights frozen"
        return "max-autotune-no-cudagraphs", why
    return "default", "auto"


def autotunes_gemms(mode: str) -> bool:
    """Whether a compile in `mode` picks its GEMM kernels among Inductor's templates and aten's."""
    return mode.startswith("max-autotune")


def freezes(mode: str, device: torch.device) -> bool:
    """Whether a compile in `mode` on `device` freezes the weights (see the module docstring)."""
    return device.type == "cpu" and autotunes_gemms(mode)


def compile_decode(fn: StepFn, mode: str) -> StepFn:
    """torch.compile with no graph breaks allowed; mode "none" = fn itself.

    Compiles a fresh wrapper with a code object of its own: dynamo keeps its compiled entries
    per code object, so two models (or two engines in one process) never share, evict or
    outnumber (dynamo's recompile limit) each other's graphs."""
    if mode == "none":
        return fn
    if mode == "reduce-overhead":
        # that mode captures CUDA graphs of its own, inside ours (on CPU it has nothing to capture)
        logger.info("graphs.compile_mode 'reduce-overhead': compiling with 'default' (graphs are ours)")
        mode = "default"

    def decode_step(batch: object) -> torch.Tensor:
        return fn(batch)

    decode_step.__code__ = decode_step.__code__.replace(co_name=f"decode_step_{id(decode_step):x}")
    return cast(StepFn, torch.compile(decode_step, fullgraph=True, mode=mode))


def mark_batch_dynamic(batch: DecodeBatch, width: bool = False, strict: bool = False) -> None:
    """Compile the row dimension (and with `width`, the block-table width) as symbols, so one
    graph serves every size (a compile per bucket would cost minutes for a 7B model). Size 1 is
    always specialised by dynamo. `strict`: if the model specialised a size after all, dynamo
    raises; otherwise ("maybe") it specialises and recompiles instead of failing."""
    mark = torch._dynamo.mark_dynamic if strict else torch._dynamo.maybe_mark_dynamic
    if width:  # the batch-1 graph too: its width varies like every other's
        mark(batch.block_tables, 1)
    if batch.num_rows < 2:
        return
    for t in (batch.input_ids, batch.positions, batch.slot_mapping, batch.seq_lens, batch.block_tables):
        mark(t, 0)
    if batch.lora_slots is not None:
        mark(batch.lora_slots, 0)
    mark(batch.query_start, 0)
