"""Weight-only int4 (group 32, asymmetric) for CPU decode: 8x fewer weight bytes than fp32.

A CPU decode step is memory-bound: every weight is read once per step, so bytes per weight set the
speed. Each group of 32 input-channel weights keeps a scale and a zero point (bf16) and 4-bit codes
q in [0, 15]; w = (q - 8) * scale + zero, torch's `_weight_int4pack_mm_for_cpu` layout. The codes
come from min/max rounding per group, which is lossless for weights that came from a GGUF Q4_1
file: Q4_1 itself maps each block's min to q = 0 and max to q = 15 (x = q * d + min), so the
same (d, min) and codes come back; only d and min are rounded to bf16. The LM head is not a Q4_1
tensor in the default file (it is the Q8_0 embedding): it gets per-row int8 (`Int8Weight`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

GROUP = 32


def int4_supported() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


class Int4Weight(nn.Module):
    """Stands in for a [N, K] weight matrix; `lin(x, w, b)` dispatches on it."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        n, k = weight.shape
        if k % GROUP:
            raise ValueError(f"int4: input dim {k} is not a multiple of {GROUP}")
        g = weight.detach().float().reshape(n, k // GROUP, GROUP)
        lo, hi = g.amin(-1), g.amax(-1)  # [N, K/G]
        scale = ((hi - lo) / 15).clamp(min=1e-12)
        codes = ((g - lo[..., None]) / scale[..., None]).round_().clamp_(0, 15).to(torch.int32)
        self.out_features, self.in_features = n, k
        self.register_buffer(
            "packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.view(n, k), 1)
        )
        zero = lo + 8 * scale
        # [K/G, N, 2]: (scale, zero) per group and output row
        self.register_buffer(
            "scales_zeros", torch.stack([scale.t(), zero.t()], -1).to(torch.bfloat16).contiguous()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] bf16 -> [..., N] bf16
        flat = x.reshape(-1, self.in_features)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_zeros)
        return y.view(*x.shape[:-1], self.out_features)


class Int8Weight(nn.Module):
    """Weight-only int8 with one scale per output row, for the LM head.

    The head of the default GGUF comes from its Q8_0 token embedding: re-quantized to int4 it lost
    enough to change greedy answers ("What is the capital of France?" stopped saying Paris, while
    bf16 kept it); per-row int8 keeps it and still reads half the bytes of bf16.
    """

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        w = weight.detach().float()  # [N, K]
        scale = (w.abs().amax(1) / 127).clamp(min=1e-12)  # [N]
        self.out_features, self.in_features = w.shape
        self.register_buffer("codes", (w / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] bf16 -> [..., N] bf16
        flat = x.reshape(-1, self.in_features)
        y = torch.ops.aten._weight_int8pack_mm(flat, self.codes, self.scales)
        return y.view(*x.shape[:-1], self.out_features)


def lin(
    x: torch.Tensor, w: torch.Tensor | Int4Weight | Int8Weight, b: torch.Tensor | None = None
) -> torch.Tensor:
    if isinstance(w, Int4Weight | Int8Weight):
        y = w(x)
        return y if b is None else y + b
    return F.linear(x, w, b)


def quantize_module_weights(module: nn.Module, names: tuple[str, ...]) -> None:
    """Replaces the named 2-D parameters of `module` by Int4Weight stand-ins (in place)."""
    for name in names:
        param = getattr(module, name)
        if isinstance(param, Int4Weight) or param is None:
            continue
        q = Int4Weight(param.data)
        delattr(module, name)
        setattr(module, name, q)
