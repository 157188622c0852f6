"""Gemma3ImageProcessor's fixed-size path, as its Pillow backend runs it: resize to the tower's
size with Pillow (bilinear by default), rescale (x / 255, in float64 then float32), normalize per
channel ((x - mean) / std), channels first. Torch-free: the front end runs it off the event loop."""

from __future__ import annotations

import numpy as np
from PIL import Image
from rillet.core.vision.gemma3.config import Gemma3Preprocess


def pixel_values(image: Image.Image, spec: Gemma3Preprocess) -> np.ndarray:
    """An RGB image -> float32 [3, height, width]."""
    if image.size != (spec.width, spec.height):
        image = image.resize((spec.width, spec.height), resample=Image.Resampling(spec.resample))
    x = np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)  # [3, H, W]
    out = x.astype(np.float64) * spec.rescale_factor if spec.do_rescale else x.astype(np.float64)
    out = out.astype(np.float32)
    if spec.do_normalize:
        mean = np.asarray(spec.image_mean, dtype=np.float32)[:, None, None]
        std = np.asarray(spec.image_std, dtype=np.float32)[:, None, None]
        out = (out - mean) / std
    return np.ascontiguousarray(out, dtype=np.float32)
