"""Reads a sentence-transformers model folder: which modules, how it pools, how long an input may be.

A folder is one when it has `modules.json`: an ordered list of modules, each with a `type` (a
class path, which moved between sentence-transformers releases, so only its last name is read)
and a `path` inside the folder. rillet runs `Transformer` (config.json + safetensors + tokenizer,
at the root or in its own folder), then `Pooling` (`1_Pooling/config.json`: `pooling_mode` since
sentence-transformers 5, or the older `pooling_mode_*_token(s)` flags) and an optional
`Normalize`. Anything else (Dense, LayerNorm, ...) is refused naming the module, rather than
served with different vectors. The input limit is `sentence_bert_config.json`'s max_seq_length,
or (sentence-transformers >= 6 writes it there) the tokenizer's model_max_length.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from rillet.core.embedding import POOLING_MODES, PoolingMode
from rillet.core.loaders.hf import find_hf_folder
from rillet.core.model.arch import ModelArch
from safetensors import safe_open

log = logging.getLogger(__name__)

# the older config's flags -> the mode they select
_LEGACY_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
_NO_LIMIT = 1_000_000  # tokenizers write a huge model_max_length when they have none


@dataclass(frozen=True)
class StFolder:
    root: Path
    model_dir: Path  # the Transformer module's folder: config.json, weights and tokenizer
    pooling: PoolingMode
    normalize: bool
    max_seq_length: int | None  # None: the model's own max_position_embeddings
    model_type: str  # config.json's model_type (bert, llama, qwen2, ...)


def is_st_folder(path: Path) -> bool:
    return path.is_dir() and (path / "modules.json").is_file()


def read_st_folder(root: Path) -> StFolder:
    """Raises ValueError naming what the folder holds that rillet cannot serve."""
    modules = _read_json(root / "modules.json")
    if not isinstance(modules, list) or not modules:
        raise ValueError(f"{root}/modules.json: expected a list of modules")
    kinds = [(_kind(m), root / str(m.get("path", "")) if isinstance(m, dict) else root) for m in modules]
    names = [k for k, _ in kinds]
    if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ValueError(
            f"{root}: modules {names} are not supported; rillet runs Transformer, Pooling and an "
            "optional Normalize, in that order"
        )
    model_dir, pooling_dir = kinds[0][1], kinds[1][1]
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"{model_dir}: the Transformer module has no config.json")
    config = _read_json(model_dir / "config.json")
    _check_bert_config(model_dir)
    _warn_prompt(root)
    return StFolder(
        root=root,
        model_dir=model_dir,
        pooling=_pooling_mode(pooling_dir),
        normalize=len(names) == 3,
        max_seq_length=_max_seq_length(model_dir),
        model_type=str(config.get("model_type", "")) if isinstance(config, dict) else "",
    )


def has_lm_head(model_dir: Path) -> bool:
    """The weights hold a language-model head (a base model saved for embeddings has none)."""
    for f in find_hf_folder(model_dir).weight_files:
        with safe_open(str(f), framework="pt") as st:
            if "lm_head.weight" in st.keys():  # noqa: SIM118 - safe_open is not a mapping
                return True
    return False


def is_base_decoder(model_dir: Path) -> bool:
    """A decoder folder saved as its base model (LlamaModel, MistralModel, Qwen2Model ... as
    embedding models such as e5-mistral are): its names lack the causal LM's `model.` prefix, and
    it has no LM head. Read as a sentence-transformers folder's Transformer module is."""
    try:
        files = find_hf_folder(model_dir).weight_files
    except FileNotFoundError:
        return False
    with safe_open(str(files[0]), framework="pt") as st:
        names = list(st.keys())
    bare = any(n.startswith(("layers.", "embed_tokens.")) for n in names)
    return bare and not any(n.startswith(("model.", "lm_head.")) for n in names)


def st_decoder_weights(
    arch: ModelArch, model_dir: Path, weights: Iterator[tuple[str, torch.Tensor]]
) -> tuple[ModelArch, Iterator[tuple[str, torch.Tensor]]]:
    """A decoder saved by sentence-transformers is the base model (LlamaModel, Qwen2Model ...): its
    names lack the `model.` prefix of a causal LM, and it has no LM head. Without one the model
    is built with the head tied to the embedding: it exists, and nothing reads it (the task is embed:
    runtime checks that)."""
    if not arch.tie_word_embeddings and not has_lm_head(model_dir):
        arch = replace(arch, tie_word_embeddings=True)
    named = ((n if n.startswith(("model.", "lm_head.")) else f"model.{n}", t) for n, t in weights)
    return arch, named


def _kind(module: Any) -> str:
    kind = module.get("type", "") if isinstance(module, dict) else ""
    return str(kind).rsplit(".", 1)[-1]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _pooling_mode(folder: Path) -> PoolingMode:
    cfg = _read_json(folder / "config.json")
    if not isinstance(cfg, dict):
        raise ValueError(f"{folder}/config.json: expected an object")
    mode = cfg.get("pooling_mode")
    if mode is None:
        mode = [m for flag, m in _LEGACY_FLAGS.items() if cfg.get(flag)]
    if isinstance(mode, list):
        mode = mode[0] if len(mode) == 1 else mode
    if mode not in POOLING_MODES:
        raise ValueError(f"{folder}: pooling {mode!r} is not supported (one of {', '.join(POOLING_MODES)})")
    return mode  # type: ignore[no-any-return]


def _max_seq_length(model_dir: Path) -> int | None:
    bert = model_dir / "sentence_bert_config.json"
    limit = _read_json(bert).get("max_seq_length") if bert.is_file() else None
    tok = model_dir / "tokenizer_config.json"
    if limit is None and tok.is_file():
        limit = _read_json(tok).get("model_max_length")
    if isinstance(limit, int | float) and 0 < limit < _NO_LIMIT:
        return int(limit)
    return None


def _check_bert_config(model_dir: Path) -> None:
    path = model_dir / "sentence_bert_config.json"
    if path.is_file() and _read_json(path).get("do_lower_case"):
        raise ValueError(f"{path}: do_lower_case (lower-casing inputs before the tokenizer) is not supported")


def _warn_prompt(root: Path) -> None:
    path = root / "config_sentence_transformers.json"
    default = _read_json(path).get("default_prompt_name") if path.is_file() else None
    if default:
        log.warning(
            "%s: the default prompt %r is not prepended by the server: clients send it with each input",
            root,
            default,
        )
