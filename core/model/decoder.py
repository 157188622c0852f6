"""One Llama-family decoder (Llama, Mistral, Qwen2, SmolLM2) over a flat batch of tokens.

Weights are raw parameters used through `F.linear` (no nn.Linear submodules: fewer Python calls
per layer, which is most of a CPU decode step after the matmuls). q/k/v are fused into one
projection ([Hq*D | Hkv*D | Hkv*D] rows) and gate/up into another ([I | I] rows); `load_weights`
takes Hugging Face Llama names and fills those slices. `forward` returns the hidden states after
the final norm; `compute_logits` applies the LM head to the rows the caller selected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from rillet.core.attention.base import AttentionBackend, StepMetadata
from rillet.core.model.arch import ModelArch
from rillet.core.model.rope import RotaryEmbedding, apply_rope
from rillet.core.quant.int4 import Int8Weight, lin, quantize_module_weights
from torch import nn

logger = logging.getLogger(__name__)

KVCache = tuple[torch.Tensor, torch.Tensor]  # k_cache, v_cache: [num_blocks, block_size, Hkv, D]


def _param(shape: tuple[int, ...], dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)


class DecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__()
        h, d, inter = arch.hidden_size, arch.head_dim, arch.intermediate_size
        qkv = (arch.num_heads + 2 * arch.num_kv_heads) * d
        self.n_q, self.n_kv, self.head_dim = arch.num_heads, arch.num_kv_heads, d
        self.eps = arch.rms_norm_eps
        self.scale = d**-0.5
        self.backend = backend
        self.input_layernorm = _param((h,), dtype)
        self.qkv_weight = _param((qkv, h), dtype)
        self.qkv_bias = _param((qkv,), dtype) if arch.attention_bias else None
        self.o_weight = _param((h, self.n_q * d), dtype)
        self.post_attention_layernorm = _param((h,), dtype)
        self.gate_up_weight = _param((2 * inter, h), dtype)
        self.down_weight = _param((h, inter), dtype)
        # Tensor parallelism (core/distributed/): o_proj and down_proj are row-parallel shards, so
        # their outputs are partial sums that this all-reduce completes (in the residual's dtype:
        # int4 shards return bf16); None on one rank.
        self.all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None

    def forward(
        self,
        x: torch.Tensor,  # [T, H] residual stream
        cos: torch.Tensor,  # [T, 1, D/2]
        sin: torch.Tensor,
        kv_cache: KVCache,
        meta: StepMetadata,
    ) -> torch.Tensor:  # [T, H]
        t, d, nq, nkv = x.shape[0], self.head_dim, self.n_q, self.n_kv
        h = F.rms_norm(x, self.input_layernorm.shape, self.input_layernorm, self.eps)
        # int4 projections return bf16 (core/quant): widened back to the residual's dtype here, or by
        # type promotion in the adds below, so in a float32 model only matmul operands are rounded
        qkv = lin(h, self.qkv_weight, self.qkv_bias).to(x.dtype)  # [T, (Hq + 2 Hkv) * D]
        # q and k share positions: rotate them as one [T, Hq + Hkv, D] view
        qk = apply_rope(qkv[:, : (nq + nkv) * d].view(t, nq + nkv, d), cos, sin)
        v = qkv[:, (nq + nkv) * d :].view(t, nkv, d)
        o = self.backend.forward(qk[:, :nq], qk[:, nq:], v, kv_cache[0], kv_cache[1], meta, self.scale)
        attn = lin(o.reshape(t, nq * d), self.o_weight)  # [T, H]
        x = x + (attn if self.all_reduce is None else self.all_reduce(attn.to(x.dtype)))
        h = F.rms_norm(x, self.post_attention_layernorm.shape, self.post_attention_layernorm, self.eps)
        gate, up = lin(h, self.gate_up_weight).chunk(2, dim=-1)  # [T, I] each
        mlp = lin(F.silu(gate.to(x.dtype)) * up, self.down_weight)  # [T, H]
        return x + (mlp if self.all_reduce is None else self.all_reduce(mlp.to(x.dtype)))


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
        self.layers = nn.ModuleList(DecoderLayer(arch, backend, dtype) for _ in range(arch.num_layers))
        self.norm = _param((h,), dtype)
        self.lm_head = None if arch.tie_word_embeddings else _param((vocab, h), dtype)
        self.quant_head: Int8Weight | None = None  # the LM head as int8, set by quantize_int4()
        # cos/sin are computed in fp32 and stored in the model dtype, as HF casts them to the input's
        self.rope = RotaryEmbedding(
            arch.head_dim,
            max_position or arch.max_position,
            arch.rope_theta,
            arch.rope_scaling,
            dtype=dtype,
            model_max_position=arch.max_position,
        )

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_caches: list[KVCache],  # one per layer
        meta: StepMetadata,
    ) -> torch.Tensor:  # [T, H], after the final norm
        x = F.embedding(input_ids, self.embed_tokens)
        cos, sin = self.rope.cos_sin(positions)
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            x = layer(x, cos, sin, kv, meta)
        return F.rms_norm(x, self.norm.shape, self.norm, self.arch.rms_norm_eps)

    @property
    def int4_weights(self) -> bool:
        """The projections are Int4Weight stand-ins (quantize_int4 was called)."""
        return self.quant_head is not None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] (rows of `forward`'s output) -> float32 logits [N, V]."""
        if self.quant_head is not None:
            return self.quant_head.refine(hidden, self.quant_head(hidden).float())
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return lin(hidden, head).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face Llama-named tensors into the fused parameters (casting dtype/device).

        Raises ValueError on an unknown name, a shape mismatch, or a parameter left unfilled.
        """
        targets = self._weight_targets()
        loaded: set[str] = set()
        for name, tensor in weights:
            if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and self.lm_head is None):
                continue  # recomputed / tied to the embedding: nothing to load
            if name not in targets:
                raise ValueError(f"load_weights: unknown weight '{name}' for {self.arch.architecture}")
            param, start, stop = targets[name]
            dst = param.data if start is None else param.data[start:stop]
            if tuple(dst.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"load_weights: '{name}' has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}"
                )
            dst.copy_(tensor)
            loaded.add(name)
        missing = sorted(set(targets) - loaded)
        if missing:
            more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
            raise ValueError(f"load_weights: missing weights {missing[:5]}{more}")

    def _weight_targets(self) -> dict[str, tuple[nn.Parameter, int | None, int | None]]:
        """HF name -> (parameter, row range or None for the whole tensor)."""
        a = self.arch
        q, kv, inter = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, a.intermediate_size
        t: dict[str, tuple[nn.Parameter, int | None, int | None]] = {
            "model.embed_tokens.weight": (self.embed_tokens, None, None),
            "model.norm.weight": (self.norm, None, None),
        }
        if self.lm_head is not None:
            t["lm_head.weight"] = (self.lm_head, None, None)
        rows = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            assert isinstance(layer, DecoderLayer)
            for proj, (lo, hi) in rows.items():
                t[f"{p}self_attn.{proj}.weight"] = (layer.qkv_weight, lo, hi)
                if layer.qkv_bias is not None:
                    t[f"{p}self_attn.{proj}.bias"] = (layer.qkv_bias, lo, hi)
            t[f"{p}self_attn.o_proj.weight"] = (layer.o_weight, None, None)
            t[f"{p}mlp.gate_proj.weight"] = (layer.gate_up_weight, 0, inter)
            t[f"{p}mlp.up_proj.weight"] = (layer.gate_up_weight, inter, 2 * inter)
            t[f"{p}mlp.down_proj.weight"] = (layer.down_weight, None, None)
            t[f"{p}input_layernorm.weight"] = (layer.input_layernorm, None, None)
            t[f"{p}post_attention_layernorm.weight"] = (layer.post_attention_layernorm, None, None)
        return t

    def quantize_int4(self) -> None:
        """CPU decode speed: every projection to weight-only int4, the LM head to int8 (an int4
        head changed greedy answers, see Int8Weight).

        Call after the weights are loaded. The model's dtype stays the activation dtype: float32
        keeps the residual stream, norms, RoPE, attention and logits in fp32 (llama.cpp's split),
        and only the weight reads are low-precision. The embedding table stays dense (a step reads
        one row of it per token); with tied embeddings the head gets its own int8 copy.
        """
        dtype = self.embed_tokens.dtype
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"int4 weights run in a float32 or bfloat16 model, not {dtype}")
        for layer in self.layers:
            quantize_module_weights(layer, ("qkv_weight", "o_weight", "gate_up_weight", "down_weight"))
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


def allocate_kv_cache(
    arch: ModelArch, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str
) -> list[KVCache]:
    """Per layer a (k, v) pair of separate zeroed tensors [num_blocks, block_size, Hkv, D].

    Separate, not views of one pool: the compiled decode step writes the cache in place, and
    torch.compile turns a write into inputs that alias each other into a copy of their whole
    storage (the full pool, every step); distinct tensors are updated in place.
    Zeroed, not empty: masked-out slots are still multiplied by a zero weight, and a NaN bit
    pattern left in never-written memory would turn that into NaN.
    """
    shape = (num_blocks, block_size, arch.num_kv_heads, arch.head_dim)
    return [
        (
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )
        for _ in range(arch.num_layers)
    ]
