"""engine.deterministic resolved for a device, with the reason the start-up log gives.

auto means "on where it measured cheap (<= 5 % slower)". Measured on the CPU (bench/engine/
determinism_cost.py): the batch-invariant kernels cost ~1.2x per eager decode step at batch 1, and
the mode serves the eager step only, which the compiled step beats by ~1.8x, so auto is off there.
On CUDA nothing is measured yet (flashinfer's deterministic options, batch-invariant GEMMs), and
`on` is refused rather than given kernels that were never checked on the device. Torch-free.
"""

from __future__ import annotations

from rillet.core.config import ConfigError, RilletConfig

KEY = "engine.deterministic"
CPU_COST = "~1.2x per eager decode step at batch 1, and the compiled decode step (~1.8x faster) is off"


def resolve_deterministic(cfg: RilletConfig, device_type: str) -> tuple[bool, str]:
    """-> (on, why). Raises ConfigError for `on` where it cannot be honoured."""
    setting = cfg.engine.deterministic
    if setting == "off":
        return False, f"{KEY} is off"
    blocker = _blocker(cfg, device_type)
    if setting == "on":
        if blocker is not None:
            raise ConfigError(KEY, f"'on' is not available: {blocker}; use 'off' or 'auto'")
        return True, f"{KEY} on"
    if blocker is not None:
        return False, f"{KEY} auto -> off ({blocker})"
    return False, f"{KEY} auto -> off (it costs more than 5 % on CPU: {CPU_COST}; set 'on' to pay it)"


def _blocker(cfg: RilletConfig, device_type: str) -> str | None:
    if device_type != "cpu":
        return f"batch-invariant kernels are implemented for the CPU only (the model runs on {device_type})"
    if cfg.parallel.tensor_parallel_size > 1:
        return "tensor parallelism (parallel.tensor_parallel_size > 1) is not covered yet"
    if cfg.model.kind == "synthetic":
        return "the synthetic model computes nothing"
    return None
