"""The supported model families, and a Hugging Face `config.json` read into a ModelArch.

HF model_type (GGUF architecture, core/loaders/gguf_arch.py):
  llama, mistral, qwen2 (llama, qwen2)     the Llama family
  qwen3 (qwen3)                            + per-head q/k RMSNorm
  gemma2 (gemma2), gemma3_text / gemma3    sandwich norms, GeGLU, (1 + w) norms, scaled embeddings,
    (gemma3)                               query_pre_attn_scalar, soft-capping, sliding layers
  phi3 (phi3)                              fused qkv / gate_up checkpoints, longrope
  mixtral (llama + experts), qwen3_moe     routed experts
    (qwen3moe)
"""

from __future__ import annotations

import math
from typing import Any

from rillet.core.config import ConfigError
from rillet.core.model.arch import ModelArch

HF_MODEL_TYPES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gemma3")
HF_MODEL_TYPES += ("phi3", "mixtral", "qwen3_moe", "qwen2_vl", "qwen2_5_vl")
# Vision-language models: a Qwen2 text model with M-RoPE under a vision tower (core/vision/qwen2_vl/)
QWEN_VL_TYPES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl")
# Encoders run only as embedding models, from a sentence-transformers folder (core/model/encoder.py)
ENCODER_MODEL_TYPES: tuple[str, ...] = ("bert",)
_GEMMA = ("gemma2", "gemma3_text", "gemma3")


class UnsupportedArchitecture(ConfigError):
    """A checkpoint of a family rillet does not run: one line naming it and the supported ones
    (a config error of `model.path`: the CLI prints it and exits 2)."""

    def __init__(self, what: str, name: str, supported: tuple[str, ...]) -> None:
        super().__init__(
            "model.path", f"{what} {name!r} is not supported (supported: {', '.join(supported)})"
        )


# Gemma3TextConfig's defaults: a multimodal Gemma 3's `text_config` lists only what differs
_GEMMA3_TEXT = {
    "vocab_size": 262208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "tie_word_embeddings": True,
}


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: a multimodal Gemma 3 nests it under `text_config`."""
    if cfg.get("model_type") == "gemma3":
        top = {k: cfg[k] for k in ("eos_token_id", "bos_token_id", "tie_word_embeddings") if k in cfg}
        return {**_GEMMA3_TEXT, **top, **(cfg.get("text_config") or {}), "model_type": "gemma3_text"}
    if cfg.get("model_type") in QWEN_VL_TYPES:
        return _qwen_vl_text(cfg)
    return cfg


def _qwen_vl_text(cfg: dict[str, Any]) -> dict[str, Any]:
    """A Qwen2-VL / Qwen2.5-VL's text model as a Qwen2 config with its `mrope_section`: released
    configs are flat with `rope_scaling {"type": "mrope", "mrope_section": ...}`, transformers 5
    nests a `text_config` whose `rope_parameters` hold the section."""
    outer = {k: v for k, v in cfg.items() if k not in ("text_config", "vision_config")}
    text = {**outer, **(cfg.get("text_config") or {})}
    section: list[int] | None = None
    for key in ("rope_scaling", "rope_parameters"):
        rope = text.get(key)
        if isinstance(rope, dict) and "mrope_section" in rope:
            section = [int(x) for x in rope["mrope_section"]]
            rest = {k: v for k, v in rope.items() if k not in ("mrope_section", "type", "rope_type")}
            kind = rope.get("rope_type", rope.get("type", "default"))
            text[key] = {**rest, "rope_type": "default"} if kind in ("mrope", "default") else rope
            if key == "rope_scaling":
                text.pop(key)
    if section is None:
        raise ConfigError("model.path", "config.json: a Qwen VL model without rope mrope_section")
    return {**text, "model_type": "qwen2", "mrope_section": section}


def _eos(cfg: dict[str, Any]) -> tuple[int, ...]:
    eos = cfg.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))


def _opt_float(x: Any) -> float | None:
    return None if x is None else float(x)


def sliding_layers(cfg: dict[str, Any], n: int, window: int | None) -> tuple[int, ...]:
    """Indices of the sliding-window layers, as transformers derives them."""
    if window is None:
        return ()
    types = cfg.get("layer_types")
    if isinstance(types, list):
        return tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    mt = cfg.get("model_type")
    if mt == "gemma2":
        return tuple(range(0, n, 2))  # sliding, global, sliding, ...
    if mt == "gemma3_text":
        period = int(cfg.get("sliding_window_pattern") or 6)  # five local, then one global
        return tuple(i for i in range(n) if (i + 1) % period)
    if mt in ("qwen2", "qwen3"):  # older configs: the layers from max_window_layers on
        return tuple(range(int(cfg.get("max_window_layers", n)), n))
    return tuple(range(n))  # mistral, mixtral, phi3, qwen3_moe: every layer


def _window(cfg: dict[str, Any]) -> int | None:
    window = cfg.get("sliding_window")
    on = cfg.get("use_sliding_window", not str(cfg.get("model_type")).startswith("qwen"))  # qwen*: off
    return int(window) if window and on else None


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None, float | None]:
    """(theta, scaling, local theta) of the global layers (and of Gemma 3's sliding ones).

    transformers >= 5 writes `rope_parameters` (theta and scaling in one dict; for Gemma 3 one
    dict per layer type); older configs write `rope_theta` + `rope_scaling`."""
    rope = cfg.get("rope_parameters")
    partial = (rope or {}).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial is not None and float(partial) != 1.0:
        raise ConfigError(
            "model.path", f"partial rotary embeddings (partial_rotary_factor {partial}) are not supported"
        )
    local: float | None = None
    if isinstance(rope, dict) and "full_attention" in rope:  # per layer type (Gemma 3)
        local = float(rope.get("sliding_attention", {}).get("rope_theta", 10000.0))
        rope = rope["full_attention"]
    elif cfg.get("model_type") == "gemma3_text":
        local = float(cfg.get("rope_local_base_freq", 10000.0))
    theta = float(cfg.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling")
    if isinstance(rope, dict):
        theta = float(rope.get("rope_theta", theta))
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default" and not scaling:
            scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    if scaling and str(scaling.get("rope_type", scaling.get("type"))) in ("longrope", "su"):
        scaling = {**scaling, "rope_type": "longrope"}
        orig = cfg.get("original_max_position_embeddings")
        if orig is not None:
            scaling.setdefault("original_max_position_embeddings", int(orig))
    return theta, scaling, local


def _moe(cfg: dict[str, Any], n: int) -> dict[str, Any]:
    mt = cfg["model_type"]
    if mt == "mixtral":
        return {
            "num_experts": int(cfg["num_local_experts"]),
            "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
            "moe_intermediate_size": int(cfg["intermediate_size"]),
            "norm_topk_prob": True,  # softmax, top-k, then the k weights renormalised
        }
    if mt == "qwen3_moe":
        step = int(cfg.get("decoder_sparse_step", 1))
        only = {int(i) for i in cfg.get("mlp_only_layers") or ()}
        return {
            "num_experts": int(cfg.get("num_experts") or cfg["num_local_experts"]),
            "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
            "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
            "norm_topk_prob": bool(cfg.get("norm_topk_prob", False)),
            "dense_layers": tuple(i for i in range(n) if i in only or (i + 1) % step),
        }
    return {}


def _gemma(cfg: dict[str, Any], hidden: int) -> dict[str, Any]:
    mt = cfg["model_type"]
    return {
        "sandwich_norms": True,
        "norm_offset": 1.0,
        "embed_scale": math.sqrt(hidden),
        "query_pre_attn_scalar": _opt_float(cfg.get("query_pre_attn_scalar", 256)),
        # Gemma 3's attention does not soft-cap (transformers ignores the key there)
        "attn_softcap": _opt_float(cfg.get("attn_logit_softcapping")) if mt == "gemma2" else None,
        "final_softcap": _opt_float(cfg.get("final_logit_softcapping")),
        "qk_norm": mt == "gemma3_text",
    }


def _check_biases(cfg: dict[str, Any], mt: str) -> None:
    """The projections rillet's layers hold a bias on: Qwen2's q/k/v (always, with no key). Elsewhere
    `attention_bias` also gives o_proj one, and `mlp_bias` the MLP's: refused by key, not by a weight
    name the loader does not know."""
    if mt != "qwen2" and cfg.get("attention_bias"):
        why = f"config.json: attention_bias true ({mt}: o_proj with a bias) is not supported"
        raise ConfigError("model.path", why)
    if cfg.get("mlp_bias"):
        raise ConfigError("model.path", "config.json: mlp_bias true (biased MLP layers) is not supported")


def arch_from_hf_config(cfg: dict[str, Any]) -> ModelArch:
    """From a Hugging Face `config.json` dict; UnsupportedArchitecture for another model_type."""
    if cfg.get("model_type", "llama") not in HF_MODEL_TYPES:
        raise UnsupportedArchitecture("model_type", str(cfg.get("model_type")), HF_MODEL_TYPES)
    cfg = {"model_type": "llama", **text_config(cfg)}
    mt = cfg["model_type"]
    _check_biases(cfg, mt)
    heads, hidden, n = int(cfg["num_attention_heads"]), int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    max_pos = int(cfg.get("max_position_embeddings", 4096))
    theta, scaling, local = _rope(cfg)
    window = _window(cfg)
    act = str(cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu")
    family: dict[str, Any] = (
        _gemma(cfg, hidden) if mt in _GEMMA else {"qk_norm": mt in ("qwen3", "qwen3_moe")}
    )
    return ModelArch(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg.get("intermediate_size") or 0),
        num_layers=n,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6 if mt in _GEMMA else 1e-5)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position=max_pos,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", mt in _GEMMA)),
        attention_bias=bool(cfg.get("attention_bias", mt == "qwen2")),
        architecture=mt,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos(cfg),
        hidden_act="gelu_tanh" if act in ("gelu_pytorch_tanh", "gelu_tanh") else act,
        # a window as long as the context masks nothing: the layers keep their kind (and RoPE)
        sliding_window=window if window is not None and window < max_pos else None,
        sliding_layers=sliding_layers(cfg, n, window),
        rope_local_theta=local,
        mrope_section=tuple(cfg.get("mrope_section") or ()),
        **family,
        **_moe(cfg, n),
    )
