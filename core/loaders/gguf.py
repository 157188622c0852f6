"""Loading a GGUF checkpoint: architecture and weights under Hugging Face Llama parameter names.

(The tokenizer in the same file is core/tokenizer/tokenizer.py's: `Tokenizer.from_gguf(path)`.)

Tensors are dequantized (core/loaders/dequant.py, bit-identical to `gguf.quants.dequantize`) and handed
out one at a time in the requested dtype. llama.cpp's converter permutes the rows of Llama's Q and
K projections so that rotary pairs are interleaved (its rope layout); that is undone here exactly
as transformers does, so the weights equal `AutoModelForCausalLM.from_pretrained(dir,
gguf_file=...)`'s.

With the cache on, the first load also stores the converted tensors (and the architecture) in a
safetensors file (core/loaders/weights_cache.py); later loads read that instead of the GGUF.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from rillet.core.loaders.dequant import FAST_TYPES, dequantize
from rillet.core.loaders.gguf_file import GGUFFile, GGUFTensorInfo, read_gguf
from rillet.core.loaders.weights_cache import cache_file, default_cache_dir, read_cache, write_cache
from rillet.core.model.arch import ModelArch

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")

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
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_YARN_KEYS = {"attn_factor": "attention_factor", "yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow"}
_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face parameter name of a GGUF tensor; None for one without a counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_TENSOR.match(gguf_name)
    if m is None or m.group(2) not in _BLOCK_NAMES:
        return None
    return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"


def expected_names(arch: ModelArch) -> list[str]:
    names = ["model.embed_tokens.weight"]
    for i in range(arch.num_layers):
        names += [f"model.layers.{i}.{part}.weight" for part in _BLOCK_NAMES.values()]
        if arch.attention_bias:
            names += [f"model.layers.{i}.self_attn.{p}_proj.bias" for p in "qkv"]
    names.append("model.norm.weight")
    if not arch.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def arch_from_gguf(gguf: GGUFFile) -> ModelArch:
    meta, name = gguf.metadata, gguf.architecture
    if name not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {name!r} is not supported (one of {SUPPORTED_ARCHITECTURES})")
    shapes = {t.name: t.shape for t in gguf.tensors}
    if "rope_freqs.weight" in shapes:
        log.warning("%s: per-frequency rope factors (rope_freqs.weight, Llama 3.1 style) are ignored", name)

    def key(k: str, default: Any = None) -> Any:
        return meta.get(f"{name}.{k}", default)

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    return ModelArch(
        vocab_size=shapes["token_embd.weight"][0],
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", heads)),
        head_dim=int(key("attention.key_length", hidden // heads)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(key),
        max_position=int(key("context_length", 4096)),
        tie_word_embeddings="output.weight" not in shapes,
        attention_bias="blk.0.attn_q.bias" in shapes,
        architecture=name,
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=tuple(dict.fromkeys(int(i) for i in eos if i is not None)),
    )


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


def _convert(gguf: GGUFFile, t: GGUFTensorInfo, arch: ModelArch, dtype: torch.dtype) -> torch.Tensor:
    shape = t.shape
    values = dequantize(gguf.raw(t), t.ggml_type, shape)  # a new float32 array
    heads = _permuted_heads(t.name, arch)
    if heads is not None:
        # llama.cpp stored each head's rows as [d0, d_half, d1, d_half+1, ...]; HF wants the two
        # rotary halves contiguous: view rows as [H, half, 2] -> [H, 2, half].
        half = shape[0] // heads // 2
        values = values.reshape(heads, half, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
    src = torch.from_numpy(values)
    return src if dtype == torch.float32 else src.to(dtype)


def _permuted_heads(gguf_name: str, arch: ModelArch) -> int | None:
    if arch.architecture != "llama":
        return None
    if ".attn_q." in gguf_name:
        return arch.num_heads
    if ".attn_k." in gguf_name:
        return arch.num_kv_heads
    return None


def iter_gguf_weights(
    gguf: GGUFFile, arch: ModelArch, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """`(hf_name, tensor)` for every tensor the model needs, in file order; raises if one is missing."""
    present = {hf_name(t.name) for t in gguf.tensors}
    missing = [n for n in expected_names(arch) if n not in present]
    if missing:
        raise ValueError(f"GGUF file lacks {len(missing)} tensors the model needs, e.g. {missing[:3]}")
    for t in gguf.tensors:
        name = hf_name(t.name)
        if name is None:
            if t.name != "rope_freqs.weight":
                log.warning("ignoring GGUF tensor %s", t.name)
            continue
        yield name, _convert(gguf, t, arch, dtype)


def _arch_to_json(arch: ModelArch) -> str:
    return json.dumps(dataclasses.asdict(arch))


def _arch_from_json(text: str) -> ModelArch:
    fields = json.loads(text)
    fields["eos_token_ids"] = tuple(fields["eos_token_ids"])
    return ModelArch(**fields)


def load_gguf(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | Path | None = None,
    use_cache: bool | None = None,
    header: GGUFFile | None = None,
) -> tuple[ModelArch, Iterator[tuple[str, torch.Tensor]]]:
    """-> (architecture, single-pass iterator of (HF name, tensor in `dtype`)), in file order.

    `cache_dir` None = ~/.cache/rillet. A cache hit never opens the GGUF file. `use_cache`:
    True / False; None (auto) reads an existing entry but writes one only when the file holds a
    tensor type that core/loaders/dequant.py leaves to gguf's slow numpy path (K-quants, ...): for the
    fast types, converting (~0.6 s CPU for SmolLM2-135M) costs about what reading the cache
    does, so a cache would only spend disk (540 MB in float32). `header`: the file already parsed
    by the caller (read_gguf), so it is not parsed twice.
    """
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype {dtype} is not supported (float32, bfloat16, float16)")
    source = Path(path)
    entry_path = cache_file(Path(cache_dir).expanduser() if cache_dir else default_cache_dir(), source, dtype)
    entry = read_cache(entry_path) if use_cache is not False else None
    if entry is not None:
        try:
            arch = _arch_from_json(entry.metadata["arch"])
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("weights cache %s has bad metadata (%s); converting again", entry_path, exc)
            entry_path.unlink(missing_ok=True)
        else:
            log.info("loading %s from the weights cache %s", source.name, entry_path)
            return arch, entry.tensors()
    gguf = header if header is not None else read_gguf(source)
    arch = arch_from_gguf(gguf)
    weights = iter_gguf_weights(gguf, arch, dtype)
    if use_cache is None:
        use_cache = any(t.ggml_type not in FAST_TYPES for t in gguf.tensors)
    if use_cache:
        weights = _caching(weights, entry_path, {"arch": _arch_to_json(arch), "source": str(source)})
    return arch, weights


def _caching(
    weights: Iterator[tuple[str, torch.Tensor]], path: Path, metadata: dict[str, str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Passes `weights` through; once all were taken, writes them to the cache (not if stopped early).

    The tensors handed out are the ones stored: a consumer copies them (as `load_weights` does);
    modifying one in place before the iteration ends would store the modified values.
    """
    kept: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        kept[name] = tensor
        yield name, tensor
    write_cache(path, kept, metadata)
