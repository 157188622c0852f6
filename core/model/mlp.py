"""The gated MLP of a decoder layer: SwiGLU (Llama, Qwen, Phi-3, Mixtral's experts) or GeGLU with
tanh-approximated GELU (Gemma), over a fused [gate | up] projection."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from rillet.core.quant.int4 import Int4Weight, lin

ACTIVATIONS = ("silu", "gelu_tanh")


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name == "silu":
        return F.silu
    if name == "gelu_tanh":
        return _gelu_tanh
    raise ValueError(f"MLP activation {name!r} is not supported (one of {', '.join(ACTIVATIONS)})")


def gated_mlp(
    h: torch.Tensor,  # [T, H]
    gate_up: torch.Tensor | Int4Weight,  # [2I, H]: gate rows, then up rows
    down: torch.Tensor | Int4Weight,  # [H, I]
    act: Callable[[torch.Tensor], torch.Tensor],
    dtype: torch.dtype,  # the residual stream's: int4 projections return bf16
) -> torch.Tensor:  # [T, H]
    gate, up = lin(h, gate_up).chunk(2, dim=-1)  # [T, I] each
    return lin(act(gate.to(dtype)) * up, down)
