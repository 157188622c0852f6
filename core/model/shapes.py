"""Named architectures for random-weight "shape" models (benchmarks: same FLOPs and bytes as the real one)."""

from __future__ import annotations

import dataclasses

from rillet.core.config import ConfigError
from rillet.core.model.arch import ModelArch

# The tokenizer is always the default model's (vocab 49152), so every shape uses that vocabulary.
_VOCAB = 49152

SHAPES: dict[str, ModelArch] = {
    "mistral-7b": ModelArch(
        vocab_size=_VOCAB,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=1e6,
        max_position=32768,
        architecture="mistral",
        eos_token_ids=(2,),
    ),
    "llama-1b": ModelArch(
        vocab_size=_VOCAB,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        rope_theta=500000.0,
        max_position=8192,
        tie_word_embeddings=True,
        eos_token_ids=(2,),
    ),
    "smollm2-135m": ModelArch(
        vocab_size=_VOCAB,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rope_theta=100000.0,
        max_position=8192,
        tie_word_embeddings=True,
        eos_token_ids=(2,),
    ),
    "tiny": ModelArch(
        vocab_size=_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position=2048,
        eos_token_ids=(2,),
    ),
}

# An MoE shape and two dense ones around it (bench/engine/moe_dispatch.py): the same attention and
# vocabulary, an MLP as wide as the MoE's two active experts, and one as wide as all eight.
_MOE_BASE = ModelArch(
    vocab_size=_VOCAB,
    hidden_size=1024,
    intermediate_size=1024,
    num_layers=12,
    num_heads=16,
    num_kv_heads=4,
    head_dim=64,
    max_position=4096,
    tie_word_embeddings=True,
    eos_token_ids=(2,),
)
SHAPES["moe-8x1k"] = dataclasses.replace(
    _MOE_BASE, architecture="mixtral", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=1024
)
SHAPES["moe-8x1k-dense-active"] = dataclasses.replace(_MOE_BASE, intermediate_size=2 * 1024)
SHAPES["moe-8x1k-dense-total"] = dataclasses.replace(_MOE_BASE, intermediate_size=8 * 1024)


def shape_arch(name: str) -> ModelArch:
    if name not in SHAPES:
        raise ConfigError("model.shape", f"unknown shape {name!r}; one of {', '.join(SHAPES)}")
    return SHAPES[name]
