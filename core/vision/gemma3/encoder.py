"""Gemma 3's `VisionTower` (core/vision/family.py): the encoder (tower.py) in the model's dtype on
its device, the checkpoint's vision tensors (weights.py), and `encode`: a batch of images' pixels
-> each image's [mm_tokens_per_image, text hidden size] embeddings, one forward for the batch."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
from rillet.core.vision.gemma3.config import Gemma3VisionArch
from rillet.core.vision.gemma3.tower import Gemma3VisionEncoder
from rillet.core.vision.gemma3.weights import claims, load_vision_weights
from rillet.core.vision.payload import MmItem


class Gemma3Tower:
    def __init__(
        self, arch: Gemma3VisionArch, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> None:
        self.arch = arch
        self.dtype = dtype
        self.device = torch.device(device)
        with torch.device(self.device):
            self.model = Gemma3VisionEncoder(arch).to(dtype).eval().requires_grad_(False)

    def claims(self, name: str) -> bool:
        return claims(name)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_vision_weights(self.model, weights)

    @torch.inference_mode()
    def encode(self, items: Sequence[MmItem]) -> list[torch.Tensor]:
        if not items:
            return []
        pixels = torch.from_numpy(np.stack([it.pixels for it in items])).to(self.device, self.dtype)
        return list(self.model(pixels).unbind(0))
