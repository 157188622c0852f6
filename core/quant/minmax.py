"""Group-32 int4 codes by min/max rounding: w = (q - 8) * scale + zero (core/quant/int4.py)."""

from __future__ import annotations

import torch


def minmax_int4(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """g [N, K/G, G] float32 -> codes [N, K/G, G] in [0, 15] (float), scale and zero [N, K/G]: each
    group's min maps to q = 0 and its max to q = 15 (lossless for a GGUF Q4_1 tensor's own blocks)."""
    lo, hi = g.amin(-1), g.amax(-1)  # [N, K/G]
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    codes = ((g - lo[..., None]) / scale[..., None]).round_().clamp_(0, 15)
    return codes, scale, lo + 8 * scale
