"""A decoder layer (DecoderLayer) with its raw, fused parameters; the model around it is decoder.py.

Weights are raw parameters used through `F.linear` (no nn.Linear submodules: fewer Python calls
per layer, which is most of a CPU decode step after the matmuls). q/k/v are fused into one
projection ([Hq*D | Hkv*D | Hkv*D] rows), gate/up into another ([I | I] rows); an MoE layer holds
its experts stacked (moe.py). `weight_targets` maps Hugging Face names onto those slices
(weights.py). A layer: norm, attention (per-head q/k norms, its RoPE, its window and soft-cap),
[a norm of its output], residual; the same around the MLP (dense or routed experts). Norm weights
are stored as applied (Gemma's 1 + w is added at load time): every norm is one `F.rms_norm`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from rillet.core.attention.base import AttentionBackend, StepMetadata
from rillet.core.attention.kv_cache import KVCache
from rillet.core.lora.stack import LayerLora
from rillet.core.model.arch import ModelArch
from rillet.core.model.mlp import activation, gated_mlp
from rillet.core.model.moe import MoE
from rillet.core.model.rope import apply_rope
from rillet.core.model.weights import Target, expert_targets
from rillet.core.quant.int4 import Int4Weight, lin
from torch import nn

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin [T, 1, D]


def empty_param(shape: tuple[int, ...], dtype: torch.dtype) -> nn.Parameter:
    """Uninitialised and frozen: load_weights or init_random fills it (decoder.py)."""
    return nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, w.shape, w, eps)


class DecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, index: int, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__()
        h, d, inter = arch.hidden_size, arch.head_dim, arch.intermediate_size
        qkv = (arch.num_heads + 2 * arch.num_kv_heads) * d
        self.n_q, self.n_kv, self.head_dim = arch.num_heads, arch.num_kv_heads, d
        self.eps = arch.rms_norm_eps
        self.scale = arch.attn_scale
        self.window = arch.layer_window(index)
        self.softcap = arch.attn_softcap
        self.local_rope = index in arch.sliding_layers and arch.uses_local_rope
        self.act = activation(arch.hidden_act)
        self.backend = backend
        self.attn_norm = empty_param((h,), dtype)
        self.qkv_weight: nn.Parameter | Int4Weight = empty_param((qkv, h), dtype)
        self.qkv_bias = empty_param((qkv,), dtype) if arch.attention_bias else None
        self.q_norm = empty_param((d,), dtype) if arch.qk_norm else None
        self.k_norm = empty_param((d,), dtype) if arch.qk_norm else None
        self.o_weight: nn.Parameter | Int4Weight = empty_param((h, self.n_q * d), dtype)
        self.attn_out_norm = empty_param((h,), dtype) if arch.sandwich_norms else None
        self.mlp_norm = empty_param((h,), dtype)
        self.mlp_out_norm = empty_param((h,), dtype) if arch.sandwich_norms else None
        self.moe: MoE | None = None
        self.gate_up_weight: nn.Parameter | Int4Weight | None = None
        self.down_weight: nn.Parameter | Int4Weight | None = None
        if arch.is_moe_layer(index):
            e, k, i = arch.num_experts, arch.num_experts_per_tok, arch.moe_intermediate_size
            self.moe = MoE(e, k, h, i, arch.norm_topk_prob, arch.hidden_act, dtype)
        else:
            self.gate_up_weight = empty_param((2 * inter, h), dtype)
            self.down_weight = empty_param((h, inter), dtype)
        # Tensor parallelism (core/distributed/): o_proj and down_proj (the experts' too) are
        # row-parallel shards, so their outputs are partial sums that this all-reduce completes;
        # None on one rank.
        self.all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None

    def _reduce(self, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # int4 projections return bf16: widened to the residual's dtype (exact)
        y = y.to(dtype)
        return y if self.all_reduce is None else self.all_reduce(y)

    def forward(
        self,
        x: torch.Tensor,  # [T, H] residual stream
        rope: Rope,  # this layer's kind of RoPE
        kv_cache: KVCache,
        meta: StepMetadata,
        mix: torch.Tensor | None = None,  # [T, L*R] LoRA slot scales of each token (None: base only)
        lora: LayerLora | None = None,  # this layer's LoRA buffers (with mix)
    ) -> torch.Tensor:  # [T, H]
        t, d, nq, nkv = x.shape[0], self.head_dim, self.n_q, self.n_kv
        cos, sin = rope
        h = _norm(x, self.attn_norm, self.eps)
        qkv = lin(h, self.qkv_weight, self.qkv_bias).to(x.dtype)  # [T, (Hq + 2 Hkv) * D]
        if lora is not None and lora.qkv is not None and mix is not None:
            qkv = qkv + lora.qkv.delta(h, mix).to(x.dtype)
        if self.q_norm is None or self.k_norm is None:
            # q and k share positions: rotate them as one [T, Hq + Hkv, D] view
            qk = apply_rope(qkv[:, : (nq + nkv) * d].view(t, nq + nkv, d), cos, sin)
            q, k = qk[:, :nq], qk[:, nq:]
        else:
            q = apply_rope(_norm(qkv[:, : nq * d].view(t, nq, d), self.q_norm, self.eps), cos, sin)
            k = apply_rope(
                _norm(qkv[:, nq * d : (nq + nkv) * d].view(t, nkv, d), self.k_norm, self.eps), cos, sin
            )
        v = qkv[:, (nq + nkv) * d :].view(t, nkv, d)
        # the cache's own scales travel with it: only the backend reads them (attention/kv_cache.py)
        o = self.backend.forward(
            q,
            k,
            v,
            kv_cache.k,
            kv_cache.v,
            meta,
            self.scale,
            window=self.window,
            softcap=self.softcap,
            scales=kv_cache.scales,
        )
        a = lin(o.reshape(t, nq * d), self.o_weight)  # [T, H]
        if lora is not None and lora.o is not None and mix is not None:
            a = a.to(x.dtype) + lora.o.delta(o.reshape(t, nq * d), mix).to(x.dtype)
        a = self._reduce(a, x.dtype)
        x = x + (a if self.attn_out_norm is None else _norm(a, self.attn_out_norm, self.eps))
        h = _norm(x, self.mlp_norm, self.eps)
        if self.moe is not None:
            m = self.moe(h)
        else:
            assert self.gate_up_weight is not None and self.down_weight is not None
            m = gated_mlp(h, self.gate_up_weight, self.down_weight, self.act, x.dtype, lora, mix)
        m = self._reduce(m, x.dtype)
        return x + (m if self.mlp_out_norm is None else _norm(m, self.mlp_out_norm, self.eps))

    def weight_targets(self, p: str, a: ModelArch) -> dict[str, Target]:
        """Canonical HF names of this layer (prefix `p`) -> (parameter, slice, is a norm)."""
        q, kv, inter = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, a.intermediate_size
        t: dict[str, Target] = {}
        rows = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}
        for proj, (lo, hi) in rows.items():
            t[f"{p}self_attn.{proj}.weight"] = (_as_param(self.qkv_weight), (slice(lo, hi),), False)
            if self.qkv_bias is not None:
                t[f"{p}self_attn.{proj}.bias"] = (self.qkv_bias, (slice(lo, hi),), False)
        t[f"{p}self_attn.o_proj.weight"] = (_as_param(self.o_weight), (), False)
        norms = {
            "input_layernorm": self.attn_norm,
            "self_attn.q_norm": self.q_norm,
            "self_attn.k_norm": self.k_norm,
        }
        if a.sandwich_norms:  # Gemma: post_attention_layernorm is the norm on the attention output
            norms |= {
                "post_attention_layernorm": self.attn_out_norm,
                "pre_feedforward_layernorm": self.mlp_norm,
            }
            norms["post_feedforward_layernorm"] = self.mlp_out_norm
        else:
            norms["post_attention_layernorm"] = self.mlp_norm
        t |= {f"{p}{n}.weight": (w, (), True) for n, w in norms.items() if w is not None}
        if self.moe is not None:
            return t | expert_targets(p, self.moe.router, self.moe.gate_up, self.moe.down, a)
        gate_up = _as_param(self.gate_up_weight)
        t[f"{p}mlp.gate_proj.weight"] = (gate_up, (slice(0, inter),), False)
        t[f"{p}mlp.up_proj.weight"] = (gate_up, (slice(inter, 2 * inter),), False)
        t[f"{p}mlp.down_proj.weight"] = (_as_param(self.down_weight), (), False)
        return t


def _as_param(w: object) -> nn.Parameter:
    if not isinstance(w, nn.Parameter):
        raise ValueError("load_weights: the model's weights are already quantized")
    return w
