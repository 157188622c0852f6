"""LoRA at start-up: the stacked buffers attached to the model, the slot table to the scheduler,
and the adapters of `lora.adapters` loaded; every refusal a ConfigError naming its key."""

from __future__ import annotations

import logging

import torch
from rillet.core.config import ConfigError, RilletConfig
from rillet.core.config.lora import LORA_MODULES
from rillet.core.engine.scheduler import Scheduler
from rillet.core.errors import AdapterError
from rillet.core.lora.adapter import LoraAdapter, read_adapter
from rillet.core.lora.registry import LoraRegistry
from rillet.core.lora.slots import SlotTable
from rillet.core.lora.stack import LoraStack
from rillet.core.model.decoder import DecoderModel

log = logging.getLogger(__name__)


def refuse_unsupported(cfg: RilletConfig, what: str | None = None) -> None:
    """ConfigError when LoRA is asked for with a feature it does not run with (yet)."""
    if not cfg.lora.enabled:
        return
    reasons = {
        "parallel.tensor_parallel_size": cfg.parallel.tensor_parallel_size > 1
        and "tensor parallelism would need the adapters sharded like the weights",
        "speculative.method": cfg.speculative.enabled
        and "the verify step does not carry adapter slots (set speculative.method off)",
        "engine.deterministic": cfg.engine.deterministic == "on"
        and "the batch-invariant mode does not cover the LoRA matmuls",
    }
    for key, why in reasons.items():
        if why:
            raise ConfigError("lora.adapters", f"LoRA adapters cannot be served with {key} set: {why}")
    if what is not None:
        raise ConfigError("lora.adapters", f"LoRA adapters need a decoder model, not {what}")


def attach_lora(
    cfg: RilletConfig, model: DecoderModel, scheduler: Scheduler, base_name: str
) -> LoraRegistry | None:
    """None when `lora` asks for nothing (no adapters, no runtime updates)."""
    lc = cfg.lora
    if not lc.enabled:
        return None
    refuse_unsupported(cfg)
    adapters = [
        _startup_adapter(name, path, cfg, model, uid)
        for uid, (name, path) in enumerate(lc.adapters.items(), 1)
    ]
    targets = frozenset(lc.target_modules) or _targets(adapters)
    device = model.embed_tokens.device
    dtype = lora_dtype(lc.dtype, model)
    stack = LoraStack(model.arch, lc.max_loras, lc.max_rank, targets, device, dtype)
    registry = LoraRegistry(model.arch, stack, lc.allow_runtime_updates, first_uid=len(adapters) + 1)
    for adapter in adapters:
        if adapter.name == base_name:
            raise ConfigError(f"lora.adapters.{adapter.name}", "an adapter cannot take the base model's name")
        try:
            registry.add(adapter)
        except AdapterError as exc:
            raise ConfigError(f"lora.adapters.{adapter.name}", exc.message) from exc
    model.attach_lora(stack)
    scheduler.lora_slots = SlotTable(lc.max_loras)
    log.info(
        "LoRA: %d slots x rank %d over %s (%s, %.1f MB a slot), %d adapters at start-up, runtime updates %s",
        lc.max_loras,
        lc.max_rank,
        ",".join(m for m in LORA_MODULES if m in targets),
        str(dtype).removeprefix("torch."),
        stack.slot_bytes / 1e6,
        len(adapters),
        "on" if lc.allow_runtime_updates else "off",
    )
    return registry


def lora_dtype(setting: str, model: DecoderModel) -> torch.dtype:
    """`lora.dtype`; auto: bfloat16 when the base projections multiply bfloat16 operands (int4
    weights cast their input to bfloat16; a bfloat16 model), so the delta's operands are rounded
    no further than the base matmul's; float32 beside float32 (and float16) weights."""
    if setting == "auto":
        bf16 = model.int4_weights or model.embed_tokens.dtype == torch.bfloat16
        return torch.bfloat16 if bf16 else torch.float32
    return torch.bfloat16 if setting == "bfloat16" else torch.float32


def _startup_adapter(name: str, path: str, cfg: RilletConfig, model: DecoderModel, uid: int) -> LoraAdapter:
    try:
        return read_adapter(name, path, model.arch, cfg.lora.max_rank, uid)
    except AdapterError as exc:
        raise ConfigError(f"lora.adapters.{name}", exc.message) from exc


def _targets(adapters: list[LoraAdapter]) -> frozenset[str]:
    """The start-up adapters' modules, or all seven when none is given at start-up."""
    used = frozenset().union(*(a.modules for a in adapters)) if adapters else frozenset()
    return used or frozenset(LORA_MODULES)
