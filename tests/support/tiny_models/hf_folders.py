"""Tiny random transformers models saved to disk, one folder per set of arguments: the builder
behind tests/conftest.py's session fixture `tiny_hf_model`. TINY_DEFAULTS make every family small
(2 layers, 256 ids, peaky logits, no EOS); FAMILY_DEFAULTS add what a family needs on top of them
(small sliding windows, soft-caps, query scales, LongRoPE, MoE experts), and the models' 1-d
weights are perturbed so that a swapped norm or a lost bias shows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

TinyHFModel = Callable[..., tuple[Path, Any]]  # (model_type, **config overrides) -> (folder, HF model)

TINY_DEFAULTS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "initializer_range": 0.1,  # peaky logits: greedy argmax never hinges on a near-tie
    "bos_token_id": None,
    "eos_token_id": None,  # generate() must not stop early in token-for-token comparisons
    "pad_token_id": None,
}


# Per family, on top of TINY_DEFAULTS: small sliding windows (prompts of the tests run past them),
# soft-caps and query scales that differ from the defaults a bug would fall back to.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3": {"head_dim": 16},
    "gemma2": {
        "head_dim": 16,
        "sliding_window": 8,
        "query_pre_attn_scalar": 24,
        "attn_logit_softcapping": 4.0,
        "final_logit_softcapping": 8.0,
    },
    "gemma3_text": {
        "num_hidden_layers": 6,  # five sliding layers, then a global one
        "head_dim": 16,
        "sliding_window": 8,
        "query_pre_attn_scalar": 16,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
        },
    },
    "phi3": {  # longrope: positions from 48 on use the long factors
        "max_position_embeddings": 256,
        "original_max_position_embeddings": 48,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0 + 0.05 * i for i in range(8)],
            "long_factor": [1.5 + 0.5 * i for i in range(8)],
        },
    },
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 64},
    "qwen3_moe": {
        "head_dim": 16,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [1],  # a dense layer between MoE ones
    },
}


def perturb_vectors(model: Any) -> None:
    # HF initialises norms to 1 and biases to 0, which would hide a swapped norm or a lost bias
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                base = 0.0 if name.endswith("bias") else 1.0
                p.copy_(base + 0.1 * torch.randn_like(p))


def make_tiny_hf_model(tmp_path_factory: pytest.TempPathFactory) -> TinyHFModel:
    """Factory: `tiny_hf_model("llama", tie_word_embeddings=True)` -> (folder, fp32 HF model in eval).

    model_type is one of llama | mistral | qwen2 | qwen3 | gemma2 | gemma3_text | phi3 | mixtral |
    qwen3_moe (FAMILY_DEFAULTS adds what a family needs on top of TINY_DEFAULTS); identical
    arguments reuse the saved folder.
    """
    import transformers

    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
        "gemma3_text": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
    }
    made: dict[str, tuple[Path, Any]] = {}

    def make(
        model_type: str, seed: int = 0, max_shard_size: str | None = None, **overrides: Any
    ) -> tuple[Path, Any]:
        key = repr((model_type, seed, max_shard_size, sorted(overrides.items())))
        if key not in made:
            config_cls, model_cls = classes[model_type]
            torch.manual_seed(seed)
            config = config_cls(**{**TINY_DEFAULTS, **FAMILY_DEFAULTS.get(model_type, {}), **overrides})
            model = model_cls(config).eval()
            perturb_vectors(model)
            folder = tmp_path_factory.mktemp(f"hf_{model_type}")
            kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
            model.save_pretrained(folder, **kwargs)
            made[key] = (folder, model)
        return made[key]

    return make
