"""A Gemma 3 folder's image side: the front end (its processor and the folder's tokenizer, for the
newline runs around an image) and the tower (weights loaded later, from the same files as the text
model: core/vision/setup.py splits them)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from rillet.core.vision.gemma3.config import preprocess_spec, vision_arch
from rillet.core.vision.gemma3.encoder import Gemma3Tower
from rillet.core.vision.gemma3.front import Gemma3Front


def is_gemma3_vlm(cfg: dict[str, object]) -> bool:
    """A Gemma3ForConditionalGeneration config (a text-only Gemma 3 is `gemma3_text`)."""
    return cfg.get("model_type") == "gemma3" and isinstance(cfg.get("vision_config"), dict)


def load_gemma3_vision(
    root: Path, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> tuple[Gemma3Front, Gemma3Tower]:
    from rillet.core.tokenizer.tokenizer import Tokenizer

    arch = vision_arch(json.loads((root / "config.json").read_text()))
    tok = Tokenizer.from_hf_folder(root)
    front = Gemma3Front(arch, preprocess_spec(root, arch), lambda s: tok.encode(s, add_special_tokens=False))
    return front, Gemma3Tower(arch, dtype, device)
