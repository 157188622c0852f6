"""The gated MLP of a decoder layer: SwiGLU (Llama, Qwen, Phi-3, Mixtral's experts) or GeGLU with
tanh-approximated GELU (Gemma), over a fused [gate | up] projection."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from rillet.core.lora.stack import LayerLora
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
    lora: LayerLora | None = None,  # LoRA deltas beside gate_up and down (core/lora/stack.py)
    mix: torch.Tensor | None = None,  # [T, L*R] with lora
) -> torch.Tensor:  # [T, H]
    gu = lin(h, gate_up)  # [T, 2I]
    if lora is not None and lora.gate_up is not None and mix is not None:
        gu = gu.to(dtype) + lora.gate_up.delta(h, mix).to(dtype)
    gate, up = gu.chunk(2, dim=-1)  # [T, I] each
    mid = act(gate.to(dtype)) * up
    out = lin(mid, down)
    if lora is not None and lora.down is not None and mix is not None:
        out = out.to(dtype) + lora.down.delta(mid, mix).to(dtype)
    return out
