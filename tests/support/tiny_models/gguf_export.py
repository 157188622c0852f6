"""A tiny transformers model written as a GGUF file the way llama.cpp's convert_hf_to_gguf.py
writes one (its names from gguf-py's tensor map, its metadata keys, its tensor changes), with a
byte-level tokenizer of 256 tokens: a test loads the same weights from a folder and from a GGUF.

What the converter changes: Llama-architecture (Llama, Mistral, Mixtral) Q/K rows are permuted
for llama.cpp's rope; Gemma norms are stored as 1 + w; Mixtral / Qwen3-MoE experts are stacked
into [E, rows, cols] tensors; Phi-3 keeps its fused qkv / gate_up (as attn_qkv / ffn_up) and
writes LongRoPE's factors as tensors. `quant` stores the matrices (and experts) in a ggml type.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from rillet.core.tokenizer.gguf import bytes_to_unicode
from safetensors import safe_open

GGUF_ARCH = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
GGUF_ARCH |= {"qwen3_moe": "qwen3moe", "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3"}

_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate_up_proj": "ffn_up",  # Phi-3: the fused tensor under ffn_up
    "mlp.gate": "ffn_gate_inp",
    "block_sparse_moe.gate": "ffn_gate_inp",
}
_GEMMA_LAYER = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")
_EXPERT_PROJ = {
    "gate_proj": "gate",
    "w1": "gate",
    "up_proj": "up",
    "w3": "up",
    "down_proj": "down",
    "w2": "down",
}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:  # llama.cpp LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf: str, model_type: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    m = re.match(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$", hf)
    assert m is not None, hf
    table = {**_LAYER, **(_GEMMA_LAYER if model_type.startswith("gemma") else {})}
    return f"blk.{m.group(1)}.{table[m.group(2)]}.{m.group(3)}"


def _tensors(folder: Path, cfg: Any, model_type: str) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array, as the converter turns the checkpoint's tensors."""
    state: dict[str, np.ndarray] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            state |= {k: st.get_tensor(k).float().numpy() for k in st.keys()}  # noqa: SIM118
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    out: dict[str, np.ndarray] = {}
    for name, t in state.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        m = _EXPERT.match(name)
        if m is not None:
            experts.setdefault((int(m.group(1)), _EXPERT_PROJ[m.group(3)]), {})[int(m.group(2))] = t
            continue
        if GGUF_ARCH[model_type] == "llama" and ".q_proj." in name:
            t = _permute(t, cfg.num_attention_heads)
        elif GGUF_ARCH[model_type] == "llama" and ".k_proj." in name:
            t = _permute(t, cfg.num_key_value_heads)
        if model_type.startswith("gemma") and name.endswith("norm.weight"):
            t = t + 1
        out[_gguf_name(name, model_type)] = t
    for (layer, proj), per in experts.items():
        out[f"blk.{layer}.ffn_{proj}_exps.weight"] = np.stack([per[e] for e in sorted(per)])
    return out


def _metadata(w: gguf.GGUFWriter, cfg: Any, model_type: str) -> None:
    arch = GGUF_ARCH[model_type]
    rope = cfg.rope_parameters
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    global_rope = rope.get("full_attention", rope)
    w.add_rope_freq_base(global_rope["rope_theta"])
    if global_rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(global_rope["factor"])
    if model_type in ("mixtral", "qwen3_moe"):
        w.add_expert_count(getattr(cfg, "num_local_experts", None) or cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    if model_type == "qwen3_moe":
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_weights_norm(bool(cfg.norm_topk_prob))
    if arch in ("gemma2", "gemma3"):
        _gemma_metadata(w, cfg, arch, head_dim)
    if arch == "phi3":
        w.add_sliding_window(cfg.sliding_window or 0)
    if arch == "phi3" and "long_factor" in rope:
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        scale = cfg.max_position_embeddings / rope["original_max_position_embeddings"]
        w.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(rope["original_max_position_embeddings"]))
        )
        w.add_sliding_window(cfg.sliding_window or 0)


def _gemma_metadata(w: gguf.GGUFWriter, cfg: Any, arch: str, head_dim: int) -> None:
    if cfg.query_pre_attn_scalar != head_dim:  # what llama.cpp would assume otherwise
        w.add_attention_scale(cfg.query_pre_attn_scalar**-0.5)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
    if cfg.final_logit_softcapping:
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    w.add_sliding_window(cfg.sliding_window)
    local = cfg.rope_parameters.get("sliding_attention", {}).get("rope_theta", 10000.0)
    if arch == "gemma3" and local != 10000.0:  # llama.cpp's default for the local layers
        w.add_rope_freq_base_swa(local)


def _tokenizer(w: gguf.GGUFWriter, vocab: int) -> None:
    spelled = bytes_to_unicode()
    tokens = [spelled[b] for b in range(256)] + [f"<extra_{i}>" for i in range(vocab - 256)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_scores([0.0] * len(tokens))  # no two-byte tokens: no merges
    w.add_add_bos_token(False)


def write_gguf(folder: Path, model_type: str, path: Path, quant: str | None = None) -> Path:
    """The saved model in `folder` as a GGUF at `path`; `quant` (e.g. "Q4_0"): the 2-D and 3-D
    block tensors stored in that ggml type."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(folder)
    w = gguf.GGUFWriter(str(path), GGUF_ARCH[model_type])
    _metadata(w, cfg, model_type)
    _tokenizer(w, cfg.vocab_size)
    for name, t in _tensors(folder, cfg, model_type).items():
        if quant is not None and name.startswith("blk.") and t.ndim >= 2:
            kind = gguf.GGMLQuantizationType[quant]
            w.add_tensor(name, gguf.quants.quantize(t, kind), raw_dtype=kind)
        else:
            w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    if "long_factor" in cfg.rope_parameters:
        for kind in ("long", "short"):
            w.add_tensor(
                f"rope_factors_{kind}.weight", np.array(cfg.rope_parameters[f"{kind}_factor"], np.float32)
            )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
