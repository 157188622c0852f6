"""Turns a loaded model's remaining batch-dependent pieces into invariant ones (deterministic mode).

What is already invariant on the CPU, measured row by row from 1 to 2048 rows at 1 and 2 threads:
the int4/int8 weight kernels (and the LM head's refine), bfloat16 linears, rms_norm, softmax and
log_softmax, embedding, RoPE, exp and tanh. What is not, and what this changes:
  - float32 projections (MKL picks its kernel by the row count): RowPaddedWeight (dense.py);
  - silu and tanh-GELU: torch's vectorised body and scalar tail round differently, so an element's
    bits depend on where it falls in its row (its position modulo the vector width) and on where
    a thread's share ends; replaced by the same formulas written with exp/tanh, which do not;
  - attention: the invariant backend (core/attention/invariant.py), chosen in build.py.
Mixture-of-experts layers are refused: each expert's matmul takes as many rows as tokens routed
to it, and its router is a dense matmul of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from rillet.core.config import ConfigError
from rillet.core.determinism.dense import RowPaddedWeight, pad_module_weights
from rillet.core.determinism.mode import KEY
from rillet.core.determinism.rows import RowPadding
from rillet.core.model.arch import ModelArch
from rillet.core.model.decoder import DecoderModel
from rillet.core.model.decoder_layer import DecoderLayer

_GELU_C = math.sqrt(2.0 / math.pi)


def silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1.0 + torch.exp(-x))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(_GELU_C * (x + 0.044715 * (x * x * x))))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"silu": silu, "gelu_tanh": gelu_tanh}


def check_supported(arch: ModelArch) -> None:
    """Raises a ConfigError naming engine.deterministic for what the invariant path cannot run."""
    if arch.num_experts > 0:
        raise ConfigError(
            KEY,
            f"'on' does not cover mixture-of-experts layers yet ({arch.architecture}: an expert's "
            "matmul takes as many rows as tokens are routed to it); use 'off'",
        )
    if arch.hidden_act not in ACTIVATIONS:
        raise ConfigError(KEY, f"'on' has no invariant form of the {arch.hidden_act} activation; use 'off'")


def make_invariant(model: DecoderModel, rows: RowPadding) -> None:
    """In place, after the weights are loaded (and quantized)."""
    check_supported(model.arch)
    act = ACTIVATIONS[model.arch.hidden_act]
    for layer in model.layers:
        assert isinstance(layer, DecoderLayer)
        pad_module_weights(layer, ("qkv_weight", "o_weight", "gate_up_weight", "down_weight"), rows)
        layer.act = act
    if model.quant_head is not None:
        return
    if model.lm_head is None:  # tied: the head is the embedding table, which stays a tensor
        if model.embed_tokens.dtype == torch.float32:
            setattr(model, "lm_head", RowPaddedWeight(model.embed_tokens.data, rows))  # noqa: B010
    else:
        pad_module_weights(model, ("lm_head",), rows)
