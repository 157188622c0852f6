"""Qwen2-VL's image processor (transformers' Qwen2VLImageProcessorPil), in numpy and Pillow:
dynamic resolution (`smart_resize` within min_pixels / max_pixels, sides multiples of
patch x merge), bicubic resize of the 8-bit image, rescale and normalize, then the patches in the
tower's order (merge blocks of 2x2 patches contiguous, each patch repeated over the temporal axis)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class Preprocessor:
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    mean: tuple[float, ...] = _CLIP_MEAN
    std: tuple[float, ...] = _CLIP_STD

    @classmethod
    def from_folder(cls, root: Path) -> Preprocessor:
        """preprocessor_config.json: `min_pixels` / `max_pixels`, or transformers 5's
        `size {shortest_edge, longest_edge}` (the same bounds); defaults where absent."""
        path = root / "preprocessor_config.json"
        raw = json.loads(path.read_text()) if path.is_file() else {}
        size = raw.get("size") or {}
        d = cls()
        return cls(
            min_pixels=int(raw.get("min_pixels") or size.get("shortest_edge") or d.min_pixels),
            max_pixels=int(raw.get("max_pixels") or size.get("longest_edge") or d.max_pixels),
            patch_size=int(raw.get("patch_size") or d.patch_size),
            temporal_patch_size=int(raw.get("temporal_patch_size") or d.temporal_patch_size),
            merge_size=int(raw.get("merge_size") or d.merge_size),
            mean=tuple(float(x) for x in raw.get("image_mean") or d.mean),
            std=tuple(float(x) for x in raw.get("image_std") or d.std),
        )

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        """transformers' smart_resize: (height, width), multiples of patch x merge, area in bounds."""
        factor = self.patch_size * self.merge_size
        h_bar = max(factor, round(height / factor) * factor)
        w_bar = max(factor, round(width / factor) * factor)
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt((height * width) / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return h_bar, w_bar

    def patches(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """An RGB image -> (patches [gh * gw, C * T * P * P] float32, grid (1, gh, gw))."""
        h, w = self.target_size(image.height, image.width)
        if (w, h) != image.size:
            image = image.resize((w, h), Image.Resampling.BICUBIC)
        scaled = (np.asarray(image, dtype=np.uint8).astype(np.float64) * (1 / 255)).astype(np.float32)
        normed = (scaled - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        x = normed.astype(np.float32).transpose(2, 0, 1)  # [C, H, W]
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        gh, gw = h // p, w // p
        x = x.reshape(3, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
        x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], t, p, p))
        return np.ascontiguousarray(x.reshape(gh * gw, 3 * t * p * p), dtype=np.float32), (1, gh, gw)
