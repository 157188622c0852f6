"""One rank's builder: from config to a loaded model and its runner, the parts every rank shares.

runtime.py assembles the whole engine (rank 0); a tensor-parallel worker rank (distributed/)
builds its own shard with the same functions. Nothing here starts other processes, so
distributed/ can import this module and runtime.py can import distributed/ without a circle.

Model kinds: `gguf` (a .gguf file; the default model), `hf` (a local Hugging Face folder), `shape`
(random weights in a named architecture, for benchmarks), `synthetic` (the null engine: no model).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from rillet.core.attention import cpu_kernel
from rillet.core.attention.base import AttentionBackend
from rillet.core.attention.invariant import InvariantAttentionBackend
from rillet.core.attention.kv_cache import bytes_per_token, resolve_kv_dtype
from rillet.core.attention.select import create_attention_backend, select_attention_backend
from rillet.core.config import ConfigError, RilletConfig
from rillet.core.determinism import startup as deterministic
from rillet.core.determinism.mode import resolve_deterministic
from rillet.core.determinism.model import check_supported
from rillet.core.graph_setup import graph_runner, start_graphs
from rillet.core.loaders.default_model import default_model_path
from rillet.core.loaders.gguf_file import GGUFFile, read_gguf
from rillet.core.loaders.st_folder import (
    StFolder,
    is_base_decoder,
    is_st_folder,
    read_st_folder,
    st_decoder_weights,
)
from rillet.core.model.arch import ModelArch
from rillet.core.model.decoder import DecoderModel, allocate_kv_cache, build_model
from rillet.core.model.shapes import shape_arch
from rillet.core.quant.select import Quantization, resolve_dtype, resolve_quantization
from rillet.core.runner.model_runner import ModelRunner
from rillet.core.runner.sampler import Sampler
from rillet.core.tokenizer.tokenizer import Tokenizer
from rillet.core.vision.setup import load_vision, split_weights
from rillet.graphs.buckets import resolve_buckets

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class ModelSource:
    """Where the weights come from. `header`: a GGUF file's parsed header, read once and shared
    by the quantization choice, the tokenizer and the loader."""

    kind: str  # gguf | hf | shape | synthetic
    path: Path | None  # a sentence-transformers folder: its Transformer module's folder
    header: GGUFFile | None = None
    st: StFolder | None = None  # a sentence-transformers folder (read unless model.task is generate)
    base: bool = False  # a decoder saved as its base model (no LM head, no `model.` prefix): embeds


@dataclass(frozen=True)
class Precision:
    quantization: Quantization  # resolved (never auto): int4 = the weights run as Int4Weight
    dtype: torch.dtype
    reason: str  # why (for the log)


def set_threads(num_threads: int | None) -> None:
    """`model.num_threads` -> torch's intra-op threads; more than the cores is refused (they would only
    wait on each other), here where the machine is known rather than when the config is read."""
    if num_threads is None:
        return
    cores = os.cpu_count() or 1
    if num_threads > cores:
        raise ConfigError("model.num_threads", f"{num_threads} is more than this machine's {cores} cores")
    torch.set_num_threads(num_threads)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("model.device", "cuda was asked for but no CUDA device is available")
    return torch.device(name)


def resolve_source(cfg: RilletConfig) -> ModelSource:
    """model.kind and model.path, validated up front with a message naming the key."""
    m = cfg.model
    if m.kind == "shape":  # random weights; a given path is only the tokenizer's source
        return ModelSource("shape", Path(m.path).expanduser() if m.path else None)
    path = Path(m.path).expanduser() if m.path else default_model_path()
    if not path.exists():
        raise ConfigError("model.path", f"{path} does not exist (a .gguf file or a Hugging Face folder)")
    kind = m.kind if m.kind != "auto" else ("hf" if path.is_dir() else "gguf")
    if kind == "gguf" and not path.is_file():
        raise ConfigError("model.path", f"{path} is not a .gguf file")
    st = None
    if kind == "hf" and m.task != "generate" and is_st_folder(path):
        try:
            st = read_st_folder(path)
        except ValueError as exc:
            raise ConfigError("model.path", str(exc)) from exc
        path = st.model_dir
    if kind == "hf" and not (path / "config.json").is_file():
        raise ConfigError("model.path", f"{path} is not a Hugging Face folder (no config.json)")
    base = kind == "hf" and st is None and is_base_decoder(path)
    return ModelSource(kind, path, read_gguf(path) if kind == "gguf" else None, st, base)


def resolve_precision(cfg: RilletConfig, src: ModelSource, device: torch.device) -> Precision:
    quant = resolve_quantization(
        cfg.model, src.kind, src.header if src.header is not None else src.path, device
    )
    dtype = resolve_dtype(cfg.model.dtype, device, quant.quantization)
    return Precision(quant.quantization, dtype, quant.reason)


def load_tokenizer(src: ModelSource) -> Tokenizer:
    if src.header is not None:
        return Tokenizer.from_gguf_metadata(src.header.metadata)
    path = src.path
    if src.kind == "hf":
        assert path is not None
        if (path / "tokenizer.json").is_file():
            return Tokenizer.from_hf_folder(path)
        log.warning("%s has no tokenizer.json: using the default model's tokenizer", path)
    # shape/synthetic models borrow the default model's (or the given file's) tokenizer
    return Tokenizer.from_gguf(path if path is not None and path.is_file() else default_model_path())


def served_name(cfg: RilletConfig, src: ModelSource) -> str:
    if cfg.model.served_name:
        return cfg.model.served_name
    if src.kind in ("shape", "synthetic"):
        return f"shape-{cfg.model.shape}" if src.kind == "shape" else "synthetic"
    if src.st is not None:
        return src.st.root.name
    assert src.path is not None
    return src.path.stem if src.path.is_file() else src.path.name


def max_model_len(cfg: RilletConfig, arch: ModelArch) -> int:
    return min(cfg.model.max_model_len or arch.max_position, arch.max_position)


def max_blocks_per_seq(cfg: RilletConfig, arch: ModelArch) -> int:
    return -(-max_model_len(cfg, arch) // cfg.cache.block_size)


def make_backend(
    cfg: RilletConfig, arch: ModelArch, device: torch.device, dtype: torch.dtype
) -> AttentionBackend:
    if resolve_deterministic(cfg, device.type)[0]:  # engine.deterministic: one backend for every row
        check_supported(arch)
        log.info("attention: invariant (engine.deterministic on)")
        return InvariantAttentionBackend(deterministic.row_padding())
    kv_dtype = resolve_kv_dtype(cfg.cache.dtype, dtype, device)
    sel = select_attention_backend(cfg.attention, device, arch, kv_dtype)
    for line in sel.log_lines:
        log.info("%s", line)
    if sel.prefill_backend != sel.backend:
        log.info("prefill backend %s is not wired yet: prefill uses %s", sel.prefill_backend, sel.backend)
    if sel.backend == "flashinfer":
        log.info("attention: flashinfer prefill kernels %s", cfg.attention.flashinfer_prefill_backend)
    buckets: tuple[int, ...] = ()
    if device.type == "cuda" and cfg.graphs.enabled != "off":
        buckets = resolve_buckets(cfg.graphs.buckets, cfg.scheduler.max_num_seqs)
    backend = create_attention_backend(
        sel.backend,
        arch,
        block_size=cfg.cache.block_size,
        dtype=dtype,
        device=device,
        graph_batch_sizes=buckets,
        max_blocks_per_seq=max_blocks_per_seq(cfg, arch),
        flashinfer_prefill_backend=cfg.attention.flashinfer_prefill_backend,
        kv_dtype=kv_dtype,
    )
    if backend.variant == cpu_kernel.VARIANT:
        log.info(
            "attention: decode and verify steps through rillet's CPU kernel (%s=torch: GEMMs)",
            cpu_kernel.KERNEL_ENV,
        )
    return backend


def load_model(
    cfg: RilletConfig, src: ModelSource, device: torch.device, precision: Precision, report: Progress
) -> DecoderModel:
    """The whole model (one rank), weights loaded and quantized as `precision` says."""
    dtype = precision.dtype
    vision = None
    if src.kind == "shape":
        arch = shape_arch(cfg.model.shape)
        model = build_model(
            arch, make_backend(cfg, arch, device, dtype), dtype, device, cfg.model.max_model_len
        )
        model.init_random(cfg.model.seed)
    else:
        assert src.path is not None
        if src.kind == "gguf":
            from rillet.core.loaders.gguf import load_gguf

            arch, weights = load_gguf(src.path, dtype, cache_dir=cfg.model.cache_dir, header=src.header)
        else:
            from rillet.core.loaders.hf import load_hf_folder

            arch, weights = load_hf_folder(src.path, dtype)
            vision = load_vision(src.path, dtype, device)
            if vision is not None:  # the tower takes its tensors, the text model the rest
                weights = split_weights(weights, vision.tower)
            if src.st is not None or src.base:  # saved by sentence-transformers, or bare: the base model
                arch, weights = st_decoder_weights(arch, src.path, weights)
        backend = make_backend(cfg, arch, device, dtype)
        model = build_model(arch, backend, dtype, device, cfg.model.max_model_len)
        # int4: each projection is quantized as soon as it is read (a lean load: core/model/weights.py)
        model.load_weights(weights, int4=precision.quantization == "int4")
        model.vision = vision
    maybe_quantize(precision.quantization, model)
    if isinstance(model.backend, InvariantAttentionBackend):
        deterministic.finish(model, model.backend.rows, cfg.cache.block_size)
    report("weights", 0.8)
    return model


def maybe_quantize(quantization: Quantization, model: DecoderModel) -> None:
    if quantization == "int4":
        model.quantize_int4()
        log.info("weights quantized to int4 (group 32) for CPU decode")


def kv_capacity(cfg: RilletConfig, arch: ModelArch, dtype: torch.dtype, device: torch.device) -> int:
    """KV blocks the pool gets: cache.num_blocks, else what the memory budget holds in the pool's
    storage dtype (cache.dtype; an int8 pool counts its scales). `dtype`: the model's."""
    kv_dtype = resolve_kv_dtype(cfg.cache.dtype, dtype, device)
    per_block = cfg.cache.block_size * bytes_per_token(arch, kv_dtype)
    if cfg.cache.num_blocks is not None:
        blocks, key = cfg.cache.num_blocks, "cache.num_blocks"
    elif device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        blocks, key = int(free * cfg.cache.memory_fraction // per_block), "cache.memory_fraction"
    else:
        blocks, key = int(cfg.cache.memory_gb * 2**30 // per_block), "cache.memory_gb"
    ram = _physical_memory() if device.type == "cpu" else None
    if ram is not None and blocks * per_block > ram:
        # allocated at once and touched as it fills: past the machine's memory the OOM killer
        # ends the process later, mid-serving, instead of this line now
        raise ConfigError(
            key,
            f"a KV pool of {blocks * per_block / 2**30:.1f} GiB does not fit this machine's "
            f"{ram / 2**30:.1f} GiB of memory",
        )
    return max(2, blocks)


def _physical_memory() -> int:
    """Bytes of RAM on this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def model_runner(
    cfg: RilletConfig,
    model: DecoderModel,
    num_blocks: int,
    eos: tuple[int, ...],
    device: torch.device,
    dtype: torch.dtype,
) -> ModelRunner:
    """The KV pool (in cache.dtype) and runner of `model` (this rank's shard under tensor
    parallelism). `dtype`: the model's."""
    arch = model.arch
    kv_dtype = resolve_kv_dtype(cfg.cache.dtype, dtype, device)
    kv = allocate_kv_cache(arch, num_blocks, cfg.cache.block_size, kv_dtype, device)
    sampler = Sampler(arch.vocab_size, eos, device)
    graphs = graph_runner(cfg, model, kv, device, max_blocks_per_seq(cfg, model.arch))
    if graphs is not None:
        start_graphs(graphs)
    return ModelRunner(model, kv, sampler, cfg.cache.block_size, device, graphs)
