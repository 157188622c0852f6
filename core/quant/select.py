"""What precision the model runs in: `model.quantization` (auto -> none | int4), then `model.dtype`.

`auto` picks int4 when the weights already are 4-bit (or fewer) in the file, the way llama.cpp runs
a GGUF at its own quantization: serving a Q4_1 file in float32 would read ~6x more bytes per decode
step than the file holds. It needs, all at once: the CPU (the only int4 kernel), a torch with that
kernel, `model.dtype` auto or bfloat16 (an explicit float32/float16 asks for full-precision
weights; auto runs float32 activations around the int4 weights, bfloat16 bf16 ones), and a
GGUF whose layer matrices (2-D `blk.*` tensors and 3-D stacked experts, by element count; the
embedding / output head and the norms are left out, as llama.cpp keeps them wider on purpose) are
mostly 4-bit ggml types.
Only the GGUF header is read (tensor infos); nothing is dequantized.

Re-grouping the 4-bit blocks to int4 group-32 min/max is lossless for Q4_1 and Q4_K (an affine
16-level grid per 32 values) up to bf16 scales; the other types land within a fraction of their
own quantization step.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Literal

import torch
from rillet.core.config import ConfigError, ModelConfig
from rillet.core.loaders.gguf_file import GGUFFile, GGUFTensorInfo, read_gguf
from rillet.core.quant.int4 import GROUP, int4_supported

Quantization = Literal["none", "int4"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# ggml types of 4 bits or fewer per weight that core/loaders/dequant.py reads (itself or through gguf).
FOUR_BIT_TYPES = frozenset(
    {"Q4_0", "Q4_1", "Q4_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S"}
    | {"IQ2_XS", "IQ2_XXS", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4"}
)


@dataclass(frozen=True)
class QuantChoice:
    quantization: Quantization
    reason: str  # one line for the log: why auto chose it ("set explicitly" otherwise)


def resolve_quantization(
    cfg: ModelConfig, kind: str, source: Path | GGUFFile | None, device: torch.device
) -> QuantChoice:
    """`model.quantization` with auto resolved; explicit none / int4 pass through unchanged.

    `source`: the model's path, or its GGUF header when the caller has parsed it already."""
    if cfg.quantization != "auto":
        return QuantChoice(cfg.quantization, "set explicitly")
    if device.type != "cpu":
        return QuantChoice("none", f"int4 runs on the CPU only, the device is {device.type}")
    if not int4_supported():
        return QuantChoice("none", "this torch build has no CPU int4 kernel")
    if cfg.dtype not in ("auto", "bfloat16"):
        return QuantChoice("none", f"model.dtype is {cfg.dtype}: full-precision weights asked for")
    if kind != "gguf" or source is None:
        return QuantChoice("none", f"a {kind} model has no quantized weights to keep")
    return _from_gguf(source if isinstance(source, GGUFFile) else read_gguf(source))


def _layer_matrices(f: GGUFFile) -> list[GGUFTensorInfo]:
    """The 2-D and 3-D `blk.*` tensors: the projections and stacked experts int4 replaces (norms
    are 1-D)."""
    return [t for t in f.tensors if t.name.startswith("blk.") and len(t.shape) >= 2]


def four_bit_fraction(f: GGUFFile) -> float:
    """Share of the layer matrices' elements stored in a 4-bit-or-lower ggml type."""
    from gguf import GGMLQuantizationType

    total = low = 0
    for t in _layer_matrices(f):
        n = prod(t.shape)
        total += n
        low += n if GGMLQuantizationType(t.ggml_type).name in FOUR_BIT_TYPES else 0
    return low / total if total else 0.0


def _from_gguf(f: GGUFFile) -> QuantChoice:
    share = four_bit_fraction(f)
    if share <= 0.5:
        return QuantChoice("none", f"only {share:.0%} of the GGUF layer weights are 4-bit or lower")
    odd = [t.name for t in _layer_matrices(f) if t.shape[-1] % GROUP]  # [.., N, K]: groups run along K
    if odd:
        return QuantChoice("none", f"{odd[0]} has an input dim not a multiple of {GROUP}")
    return QuantChoice("int4", f"{share:.0%} of the GGUF layer weights are 4-bit, on CPU")


def resolve_dtype(name: str, device: torch.device, quantization: str = "none") -> torch.dtype:
    """`model.dtype` given the resolved quantization (never auto here).

    With int4 weights the dtype is that of the activations: auto = float32, so that only the weight
    reads are 4-bit and everything else (residual stream, norms, RoPE, attention, logits) is fp32
    arithmetic, the same on every CPU; bfloat16 is the faster, CPU-dependent choice."""
    if quantization == "int4":
        if device.type != "cpu":
            raise ConfigError("model.quantization", "int4 runs on the CPU only (model.device: cpu)")
        if not int4_supported():
            raise ConfigError("model.quantization", "this torch build has no CPU int4 kernel; use none")
        if name not in ("auto", "float32", "bfloat16"):
            raise ConfigError(
                "model.dtype", f"int4 weights run with float32 or bfloat16 activations, not {name}"
            )
        return torch.bfloat16 if name == "bfloat16" else torch.float32
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]
