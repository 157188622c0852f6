"""A Hugging Face folder's vision side, when it has one: the family's front end and tower, and the
checkpoint's tensors split between the tower and the text model (core/build.py loads the latter)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rillet.core.model.families import QWEN_VL_TYPES
from rillet.core.vision.family import VisionTower
from rillet.core.vision.front import VisionFront


@dataclass(frozen=True, eq=False)
class VisionModel:
    """What the engine holds of a vision-language model (core/vision/family.py)."""

    front: VisionFront
    tower: VisionTower


def is_vision_config(cfg: dict[str, Any]) -> bool:
    """A vision-language model's config.json: Qwen2-VL / 2.5-VL, or a Gemma 3 with its tower (a
    text-only Gemma 3 is `gemma3_text`)."""
    mt = cfg.get("model_type")
    return mt in QWEN_VL_TYPES or (mt == "gemma3" and isinstance(cfg.get("vision_config"), dict))


def load_vision(root: Path, dtype: torch.dtype, device: torch.device | str = "cpu") -> VisionModel | None:
    """The folder's vision model (weights not loaded yet: `split_weights`), None for a text model.
    `device`: where a tower that places itself runs (Gemma 3's: the model's device)."""
    cfg = json.loads((root / "config.json").read_text())
    if not is_vision_config(cfg):
        return None
    if cfg.get("model_type") == "gemma3":
        from rillet.core.vision.gemma3.setup import load_gemma3_vision

        return VisionModel(*load_gemma3_vision(root, dtype, device))
    from rillet.core.vision.qwen2_vl.front import QwenVLFront
    from rillet.core.vision.qwen2_vl.pixels import Preprocessor
    from rillet.core.vision.qwen2_vl.tower import QwenVisionTower
    from rillet.core.vision.qwen2_vl.tower25 import Qwen25VisionTower

    image_token = int(cfg.get("image_token_id", cfg.get("text_config", {}).get("image_token_id", 151655)))
    front = QwenVLFront(Preprocessor.from_folder(root), image_token)
    tower = Qwen25VisionTower if cfg["model_type"] == "qwen2_5_vl" else QwenVisionTower
    return VisionModel(front, tower(cfg["vision_config"], dtype))


def split_weights(
    weights: Iterator[tuple[str, torch.Tensor]], tower: VisionTower
) -> Iterator[tuple[str, torch.Tensor]]:
    """The text model's tensors; the tower's are kept aside and loaded once the file is read."""
    mine: list[tuple[str, torch.Tensor]] = []
    for name, t in weights:
        if tower.claims(name):
            mine.append((name, t))
        else:
            yield name, t
    tower.load_weights(mine)
