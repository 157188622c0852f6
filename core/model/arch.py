"""Architecture hyper-parameters of a decoder, with the options that tell the families apart.

The defaults describe the Llama family (Llama, Mistral, Qwen2, SmolLM2): pre-norm blocks, SwiGLU,
one RoPE table, full causal attention. Every other family (core/model/families.py) is these
fields set differently: Qwen3 adds per-head q/k norms; Gemma 2/3 add sandwich norms, GeGLU, an
embedding scale, a query scale, soft-capping and sliding-window layers with their own RoPE base;
Mixtral and Qwen3-MoE replace the MLP of their MoE layers by routed experts.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelArch:
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # of the dense MLP (dense layers of an MoE model)
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # HF `rope_scaling` (llama3, linear, dynamic, yarn, longrope)
    max_position: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    architecture: str = "llama"  # the Hugging Face model_type (GGUF files: the matching one)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # ---- family options ----------------------------------------------------------------------
    hidden_act: str = "silu"  # the MLP gate's activation: silu (SwiGLU) | gelu_tanh (GeGLU)
    qk_norm: bool = False  # RMSNorm over each q and k head before RoPE (Qwen3, Gemma 3)
    sandwich_norms: bool = False  # norms on the attention and MLP outputs too (Gemma 2/3)
    norm_offset: float = 0.0  # checkpoint norm weights w scale by (norm_offset + w) (Gemma: 1)
    embed_scale: float | None = None  # embeddings times this (Gemma: sqrt(hidden_size))
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5; None: head_dim
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) before softmax (Gemma 2)
    final_softcap: float | None = None  # the same on the logits (Gemma 2)
    sliding_window: int | None = None  # a sliding layer attends to its last `sliding_window` positions
    sliding_layers: tuple[int, ...] = ()  # indices of the sliding layers (None window: unmasked)
    rope_local_theta: float | None = None  # RoPE base of sliding layers, unscaled (Gemma 3)
    # M-RoPE (Qwen2-VL): frequencies [0, D/2) split into (temporal, height, width) sections, each
    # rotated by its own position stream at prefill; () = one position stream
    mrope_section: tuple[int, ...] = ()
    # ---- mixture of experts (num_experts 0: none) --------------------------------------------
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # of one expert
    norm_topk_prob: bool = True  # renormalise the top-k routing weights to sum to 1
    dense_layers: tuple[int, ...] = ()  # layers of an MoE model that keep a dense MLP

    @property
    def attn_scale(self) -> float:
        base = self.head_dim if self.query_pre_attn_scalar is None else self.query_pre_attn_scalar
        return float(base) ** -0.5

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of `layer`, None for a global (full-context) layer."""
        return self.sliding_window if layer in self.sliding_layers else None

    @property
    def has_windows(self) -> bool:
        return self.sliding_window is not None and bool(self.sliding_layers)

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and layer not in self.dense_layers

    @property
    def uses_local_rope(self) -> bool:  # Gemma 3's sliding layers, whatever their window
        return self.rope_local_theta is not None and bool(self.sliding_layers)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ModelArch:
        fields = json.loads(text)
        for f in dataclasses.fields(cls):  # JSON has lists where the dataclass keeps tuples
            if isinstance(fields.get(f.name), list):
                fields[f.name] = tuple(fields[f.name])
        return cls(**fields)
