"""One decoder for every supported family over a flat batch of tokens (families in arch.py).

Weights are raw parameters used through `F.linear` (no nn.Linear submodules: fewer Python calls
per layer, which is most of a CPU decode step after the matmuls). q/k/v are fused into one
projection ([Hq*D | Hkv*D | Hkv*D] rows), gate/up into another ([I | I] rows); an MoE layer holds
its experts stacked (moe.py). `load_weights` fills those slices from Hugging Face names
(weights.py). A layer: norm, attention (per-head q/k norms, its RoPE, its window and soft-cap),
[a norm of its output], residual; the same around the MLP (dense or routed experts). Norm weights
are stored as applied (Gemma's 1 + w is added at load time): every norm is one `F.rms_norm`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from rillet.core.attention.base import AttentionBackend, StepMetadata
from rillet.core.attention.kv_cache import KVCache as KVCache  # re-exported: attention/kv_cache.py
from rillet.core.attention.kv_cache import allocate_kv_cache as allocate_kv_cache
from rillet.core.loaders.heap import return_free_memory
from rillet.core.lora.stack import LayerLora, LoraStack
from rillet.core.model.arch import ModelArch
from rillet.core.model.int4_layers import check_int4_dtype, quantize_layers, streaming_quantizer
from rillet.core.model.mlp import activation, gated_mlp
from rillet.core.model.moe import MoE
from rillet.core.model.rope import RotaryEmbedding, apply_rope
from rillet.core.model.weights import Target, expert_targets, load_into
from rillet.core.quant.int4 import Int4Weight, Int8Weight, lin
from torch import nn

logger = logging.getLogger(__name__)

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin [T, 1, D]


def _param(shape: tuple[int, ...], dtype: torch.dtype) -> nn.Parameter:
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
        self.attn_norm = _param((h,), dtype)
        self.qkv_weight: nn.Parameter | Int4Weight = _param((qkv, h), dtype)
        self.qkv_bias = _param((qkv,), dtype) if arch.attention_bias else None
        self.q_norm = _param((d,), dtype) if arch.qk_norm else None
        self.k_norm = _param((d,), dtype) if arch.qk_norm else None
        self.o_weight: nn.Parameter | Int4Weight = _param((h, self.n_q * d), dtype)
        self.attn_out_norm = _param((h,), dtype) if arch.sandwich_norms else None
        self.mlp_norm = _param((h,), dtype)
        self.mlp_out_norm = _param((h,), dtype) if arch.sandwich_norms else None
        self.moe: MoE | None = None
        self.gate_up_weight: nn.Parameter | Int4Weight | None = None
        self.down_weight: nn.Parameter | Int4Weight | None = None
        if arch.is_moe_layer(index):
            e, k, i = arch.num_experts, arch.num_experts_per_tok, arch.moe_intermediate_size
            self.moe = MoE(e, k, h, i, arch.norm_topk_prob, arch.hidden_act, dtype)
        else:
            self.gate_up_weight = _param((2 * inter, h), dtype)
            self.down_weight = _param((h, inter), dtype)
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


class DecoderModel(nn.Module):
    def __init__(
        self,
        arch: ModelArch,
        backend: AttentionBackend,
        dtype: torch.dtype = torch.float32,
        max_position: int | None = None,
    ) -> None:
        super().__init__()
        self.arch = arch
        self.backend = backend
        vocab, h = arch.vocab_size, arch.hidden_size
        self.embed_tokens = _param((vocab, h), dtype)
        # Gemma: sqrt(hidden) rounded to the model dtype first, as transformers multiplies by it
        self.embed_scale = (
            None if arch.embed_scale is None else float(torch.tensor(arch.embed_scale, dtype=dtype))
        )
        self.layers = nn.ModuleList(DecoderLayer(arch, i, backend, dtype) for i in range(arch.num_layers))
        self.norm = _param((h,), dtype)
        self.lm_head = None if arch.tie_word_embeddings else _param((vocab, h), dtype)
        self.quant_head: Int8Weight | None = None  # the LM head as int8, set by quantize_int4()
        # LoRA adapters' stacked buffers (attach_lora). Never read by forward, which takes them as
        # an argument: Inductor's weight freezing folds whatever a module holds into constants,
        # and a compiled step would then never see an adapter loaded into a slot.
        self.lora: LoraStack | None = None
        # cos/sin are computed in fp32 and stored in the model dtype, as HF casts them to the input's
        positions = max_position or arch.max_position
        self.rope = RotaryEmbedding(
            arch.head_dim,
            positions,
            arch.rope_theta,
            arch.rope_scaling,
            dtype=dtype,
            model_max_position=arch.max_position,
        )
        self.rope_local = None  # Gemma 3's sliding layers: their own base, no scaling
        if arch.uses_local_rope and arch.rope_local_theta is not None:
            self.rope_local = RotaryEmbedding(
                arch.head_dim, positions, arch.rope_local_theta, None, dtype=dtype
            )

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_caches: list[KVCache],  # one per layer
        meta: StepMetadata,
        lora_slots: torch.Tensor | None = None,  # [T] int64 LoRA slot of each token (0: base model)
        lora: LoraStack | None = None,  # the buffers lora_slots index (the model's own: self.lora)
    ) -> torch.Tensor:  # [T, H], after the final norm
        x = F.embedding(input_ids, self.embed_tokens)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        rope = self.rope.cos_sin(positions)
        local = rope if self.rope_local is None else self.rope_local.cos_sin(positions)
        # one mix per step, shared by every layer's LoRA projections
        mix = None if lora is None or lora_slots is None else lora.mix(lora_slots)
        for i, (layer, kv) in enumerate(zip(self.layers, kv_caches, strict=True)):
            layer_lora = lora.layers[i] if lora is not None and mix is not None else None
            x = layer(x, local if layer.local_rope else rope, kv, meta, mix, layer_lora)
        return F.rms_norm(x, self.norm.shape, self.norm, self.arch.rms_norm_eps)

    def attach_lora(self, stack: LoraStack) -> None:
        """Serve LoRA adapters from `stack` (core/lora/stack.py): callers pass it to forward."""
        if len(stack.layers) != len(self.layers):
            raise ValueError(f"LoRA buffers for {len(stack.layers)} layers, the model has {len(self.layers)}")
        self.lora = stack

    @property
    def int4_weights(self) -> bool:
        """The projections are Int4Weight stand-ins (quantize_int4 was called)."""
        return self.quant_head is not None

    def compute_logits(self, hidden: torch.Tensor, argmax_only: bool = False) -> torch.Tensor:
        """hidden [N, H] (rows of `forward`'s output) -> float32 logits [N, V]. `argmax_only`: the
        caller reads only each row's argmax (plain greedy rows), so the int8 head may give its
        exact candidates alone (Int8Weight.candidate_logits)."""
        if self.quant_head is not None and argmax_only:
            logits = self.quant_head.candidate_logits(hidden)
        elif self.quant_head is not None:
            logits = self.quant_head.refine(hidden, self.quant_head(hidden).float())
        else:
            head = self.embed_tokens if self.lm_head is None else self.lm_head
            logits = lin(hidden, head).float()
        cap = self.arch.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], int4: bool = False) -> None:
        """Copy Hugging Face-named tensors into the fused parameters (casting dtype/device).
        `int4`: quantize_int4 as the weights come in, each projection once its parts are loaded:
        the float32 model is never whole in memory (peak RSS near the int4 model's).

        Raises ValueError on an unknown name, a shape mismatch, or a parameter left unfilled.
        """
        if int4:
            check_int4_dtype(self.embed_tokens.dtype)
        on_filled = streaming_quantizer(self.layers) if int4 else None
        load_into(self.weight_targets(), weights, self.arch, tied=self.lm_head is None, on_filled=on_filled)
        if int4:
            self.quantize_int4()  # the LM head (and anything not streamed)
            return_free_memory()

    def weight_targets(self) -> dict[str, Target]:
        """Canonical HF name -> (parameter, slice of it, is a norm) for every weight to load."""
        t: dict[str, Target] = {
            "model.embed_tokens.weight": (self.embed_tokens, (), False),
            "model.norm.weight": (self.norm, (), True),
        }
        if self.lm_head is not None:
            t["lm_head.weight"] = (self.lm_head, (), False)
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, DecoderLayer)
            t |= layer.weight_targets(f"model.layers.{i}.", self.arch)
        return t

    def quantize_int4(self) -> None:
        """CPU decode speed: every projection (and expert) to weight-only int4, the LM head to int8
        (an int4 head changed greedy answers, see Int8Weight). The MoE router stays dense.

        After loading. The model's dtype stays the activation dtype: float32 keeps the residual
        stream, norms, RoPE, attention and logits in fp32 (llama.cpp's split). The embedding table
        stays dense (a step reads one row per token); a tied head gets its own int8 copy.
        """
        if self.quant_head is not None:  # done already (load_weights with int4)
            return
        check_int4_dtype(self.embed_tokens.dtype)
        quantize_layers(self.layers)
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        self.quant_head = Int8Weight(head.data)
        if self.lm_head is not None:
            del self.lm_head
            self.lm_head = None

    def init_random(self, seed: int = 0, std: float = 0.02) -> None:
        """Random weights (for "shape" models and benchmarks): N(0, std) matrices, unit norms."""
        gen = torch.Generator(device=self.embed_tokens.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if p.dim() == 1 and "bias" not in name:
                p.data.fill_(1.0)
            else:
                p.data.normal_(0.0, std, generator=gen)


def build_model(
    arch: ModelArch,
    backend: AttentionBackend,
    dtype: torch.dtype,
    device: torch.device | str,
    max_position: int | None = None,
) -> DecoderModel:
    """An uninitialised model on `device` in `dtype`: call `load_weights` or `init_random` next.

    `max_position` caps the RoPE table (default: the model's own max_position_embeddings).
    """
    with torch.device(device):
        return DecoderModel(arch, backend, dtype, max_position).eval()
