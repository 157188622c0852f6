"""A GGUF file's architecture and tensor names, read the way llama.cpp writes them.

llama.cpp's converter (convert_hf_to_gguf.py, gguf-py `gguf.constants`) names tensors per
architecture; here each maps back to its Hugging Face name, so the model loads a GGUF exactly as
it loads a folder (core/model/weights.py takes it from there). What the converter changed is
undone: the rows of Llama's Q and K projections are permuted so that rotary pairs interleave, and
Gemma's norm weights are stored as 1 + w. What it left out of the metadata (Gemma's query scale,
its window pattern, Gemma 3's local RoPE base) is what llama.cpp itself assumes.

GGUF architectures: llama (also Mixtral: llama with experts), qwen2, qwen3, qwen3moe, gemma2,
gemma3, phi3.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

import numpy as np
from rillet.core.loaders.dequant import dequantize
from rillet.core.loaders.gguf_file import GGUFFile
from rillet.core.model.arch import ModelArch
from rillet.core.model.families import UnsupportedArchitecture

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3")
_GEMMA = ("gemma2", "gemma3")

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # the router [E, H]
    "ffn_gate_exps": "mlp.experts.gate_proj",  # stacked experts [E, I, H]
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",  # [E, H, I]
    "ffn_gate_up_exps": "mlp.experts.gate_up_proj",
}
_ARCH_BLOCK_NAMES = {  # where an architecture departs from the table above
    "gemma2": {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
_ARCH_BLOCK_NAMES["gemma3"] = _ARCH_BLOCK_NAMES["gemma2"]
_IGNORED = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
_YARN_KEYS = {"attn_factor": "attention_factor", "yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow"}
_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_name(gguf_name: str, gguf_arch: str = "llama") -> str | None:
    """The Hugging Face parameter name of a GGUF tensor; None for one without a counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_TENSOR.match(gguf_name)
    names = {**_BLOCK_NAMES, **_ARCH_BLOCK_NAMES.get(gguf_arch, {})}
    if m is None or m.group(2) not in names:
        return None
    return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"


def is_ignored(gguf_name: str) -> bool:
    """Tensors read elsewhere (RoPE factors) or recomputed: no warning when they are skipped."""
    return gguf_name in _IGNORED


def expected_names(arch: ModelArch) -> list[str]:
    """The HF names a GGUF of `arch` must provide (stacked experts, fused Phi-3 projections)."""
    names = ["model.embed_tokens.weight"]
    for i in range(arch.num_layers):
        p = f"model.layers.{i}."
        if arch.architecture == "phi3":
            attn = ["self_attn.qkv_proj", "self_attn.o_proj"]
        else:
            attn = [f"self_attn.{x}_proj" for x in "qkvo"]
        names += [f"{p}{n}.weight" for n in ["input_layernorm", "post_attention_layernorm", *attn]]
        if arch.attention_bias:
            names += [f"{p}self_attn.{x}_proj.bias" for x in "qkv"]
        if arch.qk_norm:
            names += [f"{p}self_attn.{x}_norm.weight" for x in "qk"]
        if arch.sandwich_norms:
            names += [f"{p}{n}.weight" for n in ("pre_feedforward_layernorm", "post_feedforward_layernorm")]
        if arch.is_moe_layer(i):
            names += [f"{p}mlp.gate.weight", f"{p}mlp.experts.down_proj.weight"]
        elif arch.architecture == "phi3":
            names += [f"{p}mlp.gate_up_proj.weight", f"{p}mlp.down_proj.weight"]
        else:
            names += [f"{p}mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    names.append("model.norm.weight")
    if not arch.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def convert_values(gguf_arch: str, gguf_name: str, values: np.ndarray, arch: ModelArch) -> np.ndarray:
    """Undo the converter's changes to one tensor (or a row shard holding whole heads)."""
    heads = _permuted_heads(gguf_arch, gguf_name, arch)
    if heads is not None:
        # llama.cpp stored each head's rows as [d0, d_half, d1, d_half+1, ...]; HF wants the two
        # rotary halves contiguous: view rows as [H, half, 2] -> [H, 2, half].
        rows, half = values.shape[0], arch.head_dim // 2
        values = values.reshape(rows // (2 * half), half, 2, -1).swapaxes(1, 2).reshape(values.shape)
    if arch.norm_offset and gguf_name.endswith("norm.weight"):
        values = values - np.float32(arch.norm_offset)  # exact: 1 + w back to w (|w| < 1)
    return values


def _permuted_heads(gguf_arch: str, gguf_name: str, arch: ModelArch) -> int | None:
    if gguf_arch != "llama":
        return None
    if ".attn_q." in gguf_name:
        return arch.num_heads
    if ".attn_k." in gguf_name:
        return arch.num_kv_heads
    return None


def arch_from_gguf(gguf: GGUFFile) -> ModelArch:
    meta, name = gguf.metadata, gguf.architecture
    if name not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitecture("GGUF architecture", name, SUPPORTED_ARCHITECTURES)
    shapes = {t.name: t.shape for t in gguf.tensors}
    if "rope_freqs.weight" in shapes:
        log.warning("%s: per-frequency rope factors (rope_freqs.weight, Llama 3.1 style) are ignored", name)

    def key(k: str, default: Any = None) -> Any:
        return meta.get(f"{name}.{k}", default)

    hidden, heads, n = int(key("embedding_length")), int(key("attention.head_count")), int(key("block_count"))
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    fields: dict[str, Any] = {
        "vocab_size": shapes["token_embd.weight"][0],
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length", 0)),
        "num_layers": n,
        "num_heads": heads,
        "num_kv_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(key("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(key),
        "max_position": int(key("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in shapes,
        "attention_bias": "blk.0.attn_q.bias" in shapes,
        "architecture": {"qwen3moe": "qwen3_moe", "gemma3": "gemma3_text"}.get(name, name),
        "bos_token_id": int(bos) if bos is not None else None,
        "eos_token_ids": tuple(dict.fromkeys(int(i) for i in eos if i is not None)),
        "qk_norm": "blk.0.attn_q_norm.weight" in shapes,
    }
    rotary = key("rope.dimension_count")
    if rotary is not None and int(rotary) != fields["head_dim"]:
        raise ValueError(
            f"GGUF {name}: partial rotary embeddings ({rotary} of {fields['head_dim']} dims) "
            "are not supported"
        )
    experts = int(key("expert_count", 0))
    if experts:
        fields |= {
            "architecture": "mixtral" if name == "llama" else fields["architecture"],
            "num_experts": experts,
            "num_experts_per_tok": int(key("expert_used_count")),
            # Mixtral's experts are feed_forward_length wide; Qwen3-MoE says so separately
            "moe_intermediate_size": int(key("expert_feed_forward_length", fields["intermediate_size"])),
            "norm_topk_prob": bool(key("expert_weights_norm", True)),  # llama.cpp normalises both
            "dense_layers": tuple(i for i in range(n) if f"blk.{i}.ffn_gate_inp.weight" not in shapes),
        }
    if name in _GEMMA:
        fields |= _gemma(name, key, fields)
    if name == "phi3":
        fields |= _phi3(gguf, key, fields)
    return ModelArch(**fields)


def _gemma(name: str, key: Any, f: dict[str, Any]) -> dict[str, Any]:
    n, hidden = f["num_layers"], f["hidden_size"]
    scale = key("attention.scale")
    if scale is not None:
        scalar = float(scale) ** -2
    elif (name, n) in (("gemma2", 46), ("gemma3", 62)):  # 27B: llama.cpp's hidden / heads rule
        scalar = hidden / f["num_heads"]
    else:
        scalar = float(f["head_dim"])
    window = key("attention.sliding_window")
    pattern = key("attention.sliding_window_pattern", 2 if name == "gemma2" else 6)
    if isinstance(pattern, list):  # per layer: True = sliding
        sliding = tuple(i for i, s in enumerate(pattern) if s)
    else:
        sliding = tuple(i for i in range(n) if i % int(pattern) < int(pattern) - 1)
    softcap = key("attn_logit_softcapping")
    final = key("final_logit_softcapping")
    out: dict[str, Any] = {
        "hidden_act": "gelu_tanh",
        "sandwich_norms": True,
        "norm_offset": 1.0,
        "embed_scale": math.sqrt(hidden),
        "query_pre_attn_scalar": scalar,
        "attn_softcap": float(softcap) if softcap and name == "gemma2" else None,
        "final_softcap": float(final) if final else None,
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
    }
    if window:  # a window as long as the context masks nothing: the layers keep their kind (and RoPE)
        out["sliding_layers"] = sliding
        out["sliding_window"] = int(window) if int(window) < f["max_position"] else None
    if name == "gemma3":
        out["rope_local_theta"] = float(key("rope.freq_base_swa", 10000.0))
    return out


def _phi3(gguf: GGUFFile, key: Any, f: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    window = key("attention.sliding_window")
    if window and int(window) < f["max_position"]:
        out |= {"sliding_window": int(window), "sliding_layers": tuple(range(f["num_layers"]))}
    factors = {t.name: t for t in gguf.tensors if t.name in _IGNORED[1:]}
    if len(factors) == 2:  # LongRoPE (the converter writes no rope.scaling.type for it)
        short, long = (factors[f"rope_factors_{k}.weight"] for k in ("short", "long"))
        scaling: dict[str, Any] = {
            "rope_type": "longrope",
            "short_factor": dequantize(gguf.raw(short), short.ggml_type, short.shape).tolist(),
            "long_factor": dequantize(gguf.raw(long), long.ggml_type, long.shape).tolist(),
            "original_max_position_embeddings": int(key("rope.scaling.original_context_length")),
        }
        attn = key("rope.scaling.attn_factor")
        if attn is not None:
            scaling["attention_factor"] = float(attn)
        out["rope_scaling"] = scaling
    return out


def _rope_scaling(key: Any) -> dict[str, Any] | None:
    kind = key("rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling: dict[str, Any] = {"rope_type": str(kind), "factor": float(key("rope.scaling.factor", 1.0))}
    original = key("rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    for gguf_key, hf_key in _YARN_KEYS.items():
        if key(f"rope.scaling.{gguf_key}") is not None:
            scaling[hf_key] = float(key(f"rope.scaling.{gguf_key}"))
    return scaling
