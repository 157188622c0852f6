"""A vision-language model's image side joined to the runner, and what it does not run with."""

from __future__ import annotations

import json
import logging

import torch
from rillet.core.build import ModelSource
from rillet.core.config import ConfigError, RilletConfig
from rillet.core.engine.scheduler import Scheduler
from rillet.core.model.decoder import DecoderModel
from rillet.core.runner.model_runner import ModelRunner
from rillet.core.vision.encoder_cache import EncoderCache
from rillet.core.vision.mm_step import VisionStep
from rillet.core.vision.setup import VisionModel, is_vision_config

log = logging.getLogger(__name__)


def is_vision_folder(src: ModelSource) -> bool:
    if src.kind != "hf" or src.path is None or not (src.path / "config.json").is_file():
        return False
    return is_vision_config(json.loads((src.path / "config.json").read_text()))


def refuse_vision(cfg: RilletConfig, src: ModelSource) -> None:
    """Before any rank starts: a vision model runs on one rank, without speculative decoding."""
    if not is_vision_folder(src):
        return
    if cfg.parallel.tensor_parallel_size > 1:
        why = "a vision-language model runs on one rank (its tower and M-RoPE are not sharded yet)"
        raise ConfigError("parallel.tensor_parallel_size", why)
    if cfg.speculative.enabled:
        raise ConfigError(
            "speculative.method", "speculative decoding does not run with a vision-language model"
        )


def attach_vision(
    cfg: RilletConfig, model: DecoderModel, runner: ModelRunner, scheduler: Scheduler, device: torch.device
) -> VisionModel | None:
    vision: VisionModel | None = model.vision
    if vision is None:
        return None
    check_image_blocks(cfg, vision, model)
    cache = EncoderCache(cfg.vision.encoder_cache_mb * 2**20)
    runner.vision = VisionStep(vision.tower, cache, device, mrope=bool(model.arch.mrope_section))
    scheduler.encoder_budget = cfg.vision.encoder_budget_tokens
    front = vision.front
    front.max_images, front.max_pixels = cfg.vision.max_images, cfg.vision.max_pixels
    log.info("vision: images through %s", type(vision.tower).__name__)
    return vision


def check_image_blocks(cfg: RilletConfig, vision: VisionModel, model: DecoderModel) -> None:
    """A family whose images attend bidirectionally (Gemma 3) needs a prefill attention that
    honours AttentionMetadata.image_blocks, and a step budget that holds a whole image."""
    tokens = getattr(vision.front, "image_block_tokens", 0)
    if not tokens:
        return
    if not model.backend.image_blocks:
        need = "its images' tokens attend to each other, later ones too"
        if model.backend.name == "invariant":
            why = f"deterministic attention has no bidirectional image blocks ({need}); set it off"
            raise ConfigError("engine.deterministic", why)
        why = f"the {model.backend.name} backend has no bidirectional image blocks ({need}); use torch"
        raise ConfigError("attention.backend", why)
    if cfg.scheduler.max_num_batched_tokens < tokens:
        why = f"must hold one whole image's {tokens} tokens (a prefill chunk never splits one)"
        raise ConfigError("scheduler.max_num_batched_tokens", why)
