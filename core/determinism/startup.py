"""Deterministic mode at start-up: resolve it, make the loaded model invariant, self-test, log why."""

from __future__ import annotations

import logging
import time

import torch
from rillet.core.config import ConfigError, RilletConfig
from rillet.core.determinism.mkl import ensure_strict, strict_in_force
from rillet.core.determinism.mode import KEY, resolve_deterministic
from rillet.core.determinism.model import make_invariant
from rillet.core.determinism.rows import RowPadding
from rillet.core.determinism.selftest import self_test
from rillet.core.model.decoder import DecoderModel

log = logging.getLogger(__name__)


def begin(cfg: RilletConfig, device: torch.device) -> bool:
    """Before the model loads: resolves the mode, logs it, and asks MKL for strict
    reproducibility while that is still possible (before its first call). -> on."""
    on, why = resolve_deterministic(cfg, device.type)
    log.info("deterministic inference: %s (%s)", "on" if on else "off", why)
    if on:
        ensure_strict()
    return on


def row_padding() -> RowPadding:
    return RowPadding(strict_in_force())


def finish(model: DecoderModel, rows: RowPadding, block_size: int) -> None:
    """After the weights are loaded and quantized; raises ConfigError if the self-test fails."""
    make_invariant(model, rows)
    start = time.perf_counter()
    failure = self_test(model, block_size)
    threads = torch.get_num_threads()
    if failure is not None:
        raise ConfigError(
            KEY,
            f"'on' failed its start-up self-test ({failure}; {rows.describe()}, {threads} threads): "
            "this CPU, MKL build or thread count is not covered; use 'off'",
        )
    log.info(
        "deterministic inference: invariant attention and matmuls (%s, %d threads), the eager "
        "decode step only; self-test passed in %.2f s",
        rows.describe(),
        threads,
        time.perf_counter() - start,
    )
