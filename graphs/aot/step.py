"""A loaded step library as a step: called with a batch like the torch.compile'd function it
replaces.

The library (AOTInductor's: graphs/aot/export.py) takes the batch's tensors and the model's
`step_state`, flat, and writes the pool in place, as the eager step does. It runs no Python
between its kernels: no dynamo, no guards. A library is checked against the eager forward once,
on a batch of padding rows, before it is used (`agrees_with_eager`): digests catch a damaged
file, this catches a library that loads but computes something else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from rillet.graphs.aot.export import decode_inputs, verify_inputs
from rillet.graphs.interface import DecodeBatch, VerifyBatch

logger = logging.getLogger(__name__)

# a library agrees with eager when its outputs on padding rows are this close, relative to the
# largest output: compiled kernels round differently (fused reductions, the int4 template), a
# wrong library is off by the outputs' own size
AGREE_RTOL = 0.1


def load_library(path: Path) -> tuple[Callable[..., Any], float]:
    """(a callable over the flat inputs, seconds to load the library)."""
    start = time.perf_counter()
    allow_amx()
    runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(path), 1)

    def run(*flat: torch.Tensor) -> list[torch.Tensor]:
        return runner.run(list(flat))  # type: ignore[no-any-return]

    return run, time.perf_counter() - start


def allow_amx() -> bool:
    """Asks Linux for the AMX tile state (arch_prctl XTILEDATA) where the CPU has it; whether it may
    run AMX code. A library built where Inductor found AMX (the int4 GEMM template's microkernel)
    runs tile instructions, and a process that never asked dies of SIGILL at the first one.
    torch.compile asks while it picks the ISA; a process that only loads a library must ask itself."""
    return bool(torch.cpu._is_amx_tile_supported() and torch.cpu._init_amx())


class SavedDecode:
    """A DecodeBatch -> hidden states [n, H], like CompiledDecode.fn."""

    def __init__(self, runner: Callable[..., Any], state: Sequence[torch.Tensor]) -> None:
        self.runner = runner
        self.state = list(state)

    def __call__(self, batch: DecodeBatch) -> torch.Tensor:
        return _one(self.runner(*decode_inputs(batch, self.state)))


AUTO_SMALL_BATCH = 4  # graphs.small_batch auto's rows where the CPU has AMX


def small_batch_rows(setting: int | str) -> int:
    """graphs.small_batch resolved. auto: 4 rows where the CPU has AMX tiles, whose int4 template
    the autotuned steps settle on (flat in the rows; aten's kernel 1.3x faster at one row); else 0:
    on an AVX-512 CPU without AMX Inductor's weight-only int4 template and aten's kernel measured
    alike at 1-8 rows (bench.kernels.step_rows, bench/RESULTS.md 2026-12-03), and a second step
    would only cost its build, its 187 MB on disk and ~340 MiB of RSS."""
    if setting != "auto":
        return int(setting)
    return AUTO_SMALL_BATCH if torch.cpu._is_amx_tile_supported() else 0


class ByRows:
    """A decode batch of at most `rows` rows through `small`, a larger one through `general`:
    the small-batch step (graphs/aot/saved.py DECODE_SMALL) beside the general one."""

    def __init__(self, small: SavedDecode, general: SavedDecode, rows: int) -> None:
        self.small = small
        self.general = general
        self.rows = rows

    def __call__(self, batch: DecodeBatch) -> torch.Tensor:
        step = self.small if batch.num_rows <= self.rows else self.general
        return step(batch)


class SavedVerify:
    """A VerifyBatch -> hidden states [n * Q, H], like CompiledVerify.fn."""

    def __init__(self, runner: Callable[..., Any], state: Sequence[torch.Tensor]) -> None:
        self.runner = runner
        self.state = list(state)

    def __call__(self, batch: VerifyBatch) -> torch.Tensor:
        return _one(self.runner(*verify_inputs(batch, self.state)))


def agrees_with_eager(saved: torch.Tensor, eager: torch.Tensor) -> str | None:
    """None when the two outputs agree; otherwise how they differ."""
    if saved.shape != eager.shape:
        return f"output shape {tuple(saved.shape)}, eager {tuple(eager.shape)}"
    if not torch.isfinite(saved).all():
        return "non-finite outputs"
    scale = float(eager.abs().max()) or 1.0
    err = float((saved.float() - eager.float()).abs().max())
    return None if err <= AGREE_RTOL * scale else f"outputs off by {err:.3g} (largest {scale:.3g})"


def _one(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, list | tuple) else out  # type: ignore[no-any-return]
