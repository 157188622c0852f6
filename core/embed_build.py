"""What a model serves (`model.task`), how it pools, and the parts of an encoder's engine.

Tasks: `auto` is embed for a sentence-transformers folder and generate otherwise; `both` lets one
decoder serve chat and embeddings from one engine (one scheduler, one KV pool, one step).
Decoders embed through the generation machinery (model_runner.py with a ChunkPooler); a
BERT-family encoder gets its own runner (encoder_runner.py), a KV pool of none, and a token budget
that must hold a whole input (its prompts are never chunked).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import torch
from rillet.core.build import ModelSource, Precision
from rillet.core.config import ConfigError, RilletConfig
from rillet.core.embedding import Pooling, PoolingMode, Task
from rillet.core.loaders.hf import find_hf_folder, iter_safetensors
from rillet.core.loaders.st_folder import has_lm_head
from rillet.core.model.encoder import EncoderArch, build_encoder
from rillet.core.model.families import ENCODER_MODEL_TYPES as ENCODERS
from rillet.core.runner.encoder_runner import EncoderRunner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbedSetup:
    tasks: frozenset[Task]
    pooling: Pooling | None  # None: the model does not embed
    encoder: bool  # a BERT-family encoder (embed only, whole prompts, no KV cache)


def resolve_tasks(cfg: RilletConfig, src: ModelSource) -> EmbedSetup:
    """model.task / pooling / normalize for this source, each mistake a ConfigError naming its key."""
    m = cfg.model
    task = m.task if m.task != "auto" else ("embed" if src.st is not None or src.base else "generate")
    encoder = _model_type(src) in ENCODERS
    if encoder and task != "embed":
        raise ConfigError("model.task", f"{task}: a {_model_type(src)} encoder can only embed (use embed)")
    tasks: frozenset[Task] = frozenset(
        {"generate", "embed"} if task == "both" else {"generate"} if task == "generate" else {"embed"}
    )
    if src.st is not None and "generate" in tasks and not has_lm_head(src.st.model_dir):
        raise ConfigError(
            "model.task", f"{task}: {src.st.root} holds no language-model head to generate with"
        )
    if src.base and "generate" in tasks:
        raise ConfigError("model.task", f"{task}: {src.path} is a base model with no language-model head")
    if (src.st is not None or src.base) and cfg.parallel.tensor_parallel_size > 1:
        raise ConfigError(
            "parallel.tensor_parallel_size",
            "an embedding model's folder (sentence-transformers or a base model) runs on one rank (use 1)",
        )
    if "embed" not in tasks:
        return EmbedSetup(tasks, None, False)
    return EmbedSetup(tasks, _pooling(cfg, src, encoder), encoder)


def _pooling(cfg: RilletConfig, src: ModelSource, encoder: bool) -> Pooling:
    m, st = cfg.model, src.st
    default: PoolingMode = "cls" if encoder else "lasttoken"
    mode: PoolingMode = m.pooling if m.pooling != "auto" else st.pooling if st is not None else default
    normalize = m.normalize == "on" or (m.normalize == "auto" and (st is None or st.normalize))
    return Pooling(mode, normalize)


def _model_type(src: ModelSource) -> str:
    if src.st is not None:
        return src.st.model_type
    if src.kind != "hf" or src.path is None:
        return ""
    cfg = json.loads((src.path / "config.json").read_text(encoding="utf-8"))
    return str(cfg.get("model_type", "")) if isinstance(cfg, dict) else ""


@dataclass(frozen=True)
class EncoderParts:
    runner: EncoderRunner
    max_model_len: int
    embedding_size: int


def load_encoder(
    cfg: RilletConfig,
    src: ModelSource,
    setup: EmbedSetup,
    device: torch.device,
    precision: Precision,
    tokenizer_vocab: int,
) -> EncoderParts:
    assert src.path is not None and setup.pooling is not None
    if cfg.parallel.tensor_parallel_size > 1:
        raise ConfigError("parallel.tensor_parallel_size", "an encoder runs on one rank (use 1)")
    if precision.quantization != "none":
        raise ConfigError("model.quantization", "an encoder runs with full-precision weights (use none)")
    folder = find_hf_folder(src.path)
    try:
        arch = EncoderArch.from_hf_config(json.loads(folder.config.read_text(encoding="utf-8")))
    except ValueError as exc:
        raise ConfigError("model.path", f"{src.path}: {exc}") from exc
    if tokenizer_vocab > arch.vocab_size:  # the API checks ids against the tokenizer's vocabulary
        raise ConfigError(
            "model.path",
            f"{src.path}: the tokenizer has {tokenizer_vocab} ids, the model's embedding {arch.vocab_size}",
        )
    limits = [arch.max_position, cfg.model.max_model_len, src.st.max_seq_length if src.st else None]
    max_len = min(x for x in limits if x is not None)
    budget = cfg.scheduler.max_num_batched_tokens
    if budget < max_len:
        raise ConfigError(
            "scheduler.max_num_batched_tokens",
            f"{budget} cannot hold a whole input of the encoder ({max_len} tokens: it runs each input "
            f"in one step); raise it or lower model.max_model_len",
        )
    model = build_encoder(arch, precision.dtype, device)
    model.load_weights(iter_safetensors(folder.weight_files, precision.dtype))
    packed = model.pack()
    log.info(
        "encoder %s: %d layers, hidden %d, inputs up to %d tokens, %s pooling%s, projections: %s",
        src.path.name,
        arch.num_layers,
        arch.hidden_size,
        max_len,
        setup.pooling.mode,
        ", normalized" if setup.pooling.normalize else "",
        "oneDNN (packed)" if packed else "F.linear",
    )
    return EncoderParts(EncoderRunner(model, setup.pooling, device), max_len, arch.hidden_size)
