"""From a `RilletConfig` to everything the engine runs: tokenizer, model, KV pool, scheduler, runner.

Model kinds: `gguf` (a .gguf file; the default model), `hf` (a local Hugging Face folder), `shape`
(random weights in a named architecture, for benchmarks), `synthetic` (the null engine: no model).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from rillet.core.attention.base import AttentionBackend
from rillet.core.attention.select import create_attention_backend, select_attention_backend
from rillet.core.config import CompileMode, ConfigError, RilletConfig
from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.detokenizer import IncrementalDetokenizer, token_text_table
from rillet.core.engine.scheduler import Scheduler
from rillet.core.loaders.default_model import default_model_path
from rillet.core.loaders.gguf_file import GGUFFile, read_gguf
from rillet.core.loaders.weights_cache import default_cache_dir
from rillet.core.model.arch import ModelArch
from rillet.core.model.decoder import DecoderModel, KVCache, allocate_kv_cache, build_model
from rillet.core.model.shapes import shape_arch
from rillet.core.quant.select import Quantization, resolve_dtype, resolve_quantization
from rillet.core.runner.model_runner import DecoderGraphAdapter, ModelRunner, Runner
from rillet.core.runner.sampler import Sampler
from rillet.core.runner.synthetic import SyntheticRunner
from rillet.core.sequence import Seq
from rillet.core.tokenizer.tokenizer import Tokenizer
from rillet.graphs.buckets import resolve_buckets
from rillet.graphs.compiled import resolve_compile_mode, set_compile_cache_dir
from rillet.graphs.runner import GraphRunner, resolve_decode_mode

if TYPE_CHECKING:
    from rillet.core.distributed.cluster import TPCluster

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]


@dataclass
class Runtime:
    tokenizer: Tokenizer
    model_name: str
    max_model_len: int
    scheduler: Scheduler
    runner: Runner
    make_detokenizer: Callable[[Seq], IncrementalDetokenizer]
    device: torch.device
    dtype: torch.dtype
    arch: ModelArch | None
    quantization: Quantization = "none"  # resolved (never auto): int4 = the weights run as Int4Weight
    cluster: TPCluster | None = None  # tensor parallelism: the other ranks (rank 0's view)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("model.device", "cuda was asked for but no CUDA device is available")
    return torch.device(name)


def resolve_model(cfg: RilletConfig) -> tuple[str, Path | None]:
    """-> (kind, path); validates the path up front with a message naming the key."""
    m = cfg.model
    if m.kind == "shape":  # random weights; a given path is only the tokenizer's source
        return "shape", Path(m.path).expanduser() if m.path else None
    path = Path(m.path).expanduser() if m.path else default_model_path()
    if not path.exists():
        raise ConfigError("model.path", f"{path} does not exist (a .gguf file or a Hugging Face folder)")
    kind = m.kind
    if kind == "auto":
        kind = "hf" if path.is_dir() else "gguf"
    if kind == "gguf" and not path.is_file():
        raise ConfigError("model.path", f"{path} is not a .gguf file")
    if kind == "hf" and not (path / "config.json").is_file():
        raise ConfigError("model.path", f"{path} is not a Hugging Face folder (no config.json)")
    return kind, path


def load_tokenizer(kind: str, path: Path | None, header: GGUFFile | None = None) -> Tokenizer:
    """`header`: the GGUF at `path`, when the caller has parsed it already."""
    if header is not None:
        return Tokenizer.from_gguf_metadata(header.metadata)
    if kind == "hf":
        assert path is not None
        if (path / "tokenizer.json").is_file():
            return Tokenizer.from_hf_folder(path)
        log.warning("%s has no tokenizer.json: using the default model's tokenizer", path)
    # gguf, and shape/synthetic models borrow the default model's (or the given file's) tokenizer
    return Tokenizer.from_gguf(path if path is not None and path.is_file() else default_model_path())


def load_runtime(cfg: RilletConfig, progress: Progress | None = None) -> Runtime:
    report: Progress = progress or (lambda stage, frac: None)
    device = resolve_device(cfg.model.device)
    if cfg.model.num_threads is not None:
        torch.set_num_threads(cfg.model.num_threads)
    kind, path = resolve_model(cfg)
    # One parse of a GGUF header serves the quantization choice, the tokenizer and the loader.
    header = read_gguf(path) if kind == "gguf" and path is not None else None
    quant = resolve_quantization(cfg.model, kind, header if header is not None else path, device)
    if cfg.model.quantization == "auto":
        log.info("quantization auto -> %s: %s", quant.quantization, quant.reason)
    dtype = resolve_dtype(cfg.model.dtype, device, quant.quantization)
    report("tokenizer", 0.0)
    tokenizer = load_tokenizer(kind, path, header)
    name = cfg.model.served_name or _served_name(kind, path, cfg)
    if kind == "synthetic":
        return _synthetic_runtime(cfg, tokenizer, name, device, dtype, report)
    report("weights", 0.1)
    cluster = None
    if cfg.parallel.tensor_parallel_size > 1:
        from rillet.core.distributed.cluster import TPCluster

        cluster = TPCluster.start(cfg, kind, path, header, device, quant.quantization)
    try:
        if cluster is None:
            arch, model = _load_model(cfg, kind, path, header, device, dtype, quant.quantization, report)
        else:  # this rank's shard; the workers load theirs meanwhile
            arch, model = cluster.arch, cluster.load_model(kind, path, header, dtype, quant.quantization)
        num_blocks = _num_blocks(cfg, model.arch, dtype, device)
        if cluster is not None:
            num_blocks = cluster.agree_blocks(model, num_blocks)
        blocks = BlockManager(num_blocks, cfg.cache.block_size, cfg.cache.prefix_caching)
        report("kv cache", 0.9)
        max_len = min(cfg.model.max_model_len or arch.max_position, arch.max_position)
        eos = tuple(sorted(set(tokenizer.eos_token_ids) | set(arch.eos_token_ids)))
        model_runner = _model_runner(cfg, model, blocks.num_blocks, eos, device, dtype)
        runner: Runner = model_runner if cluster is None else cluster.wrap(model_runner)
    except BaseException:
        if cluster is not None:
            cluster.close(graceful=False)
        raise
    report("ready", 1.0)
    log.info(
        "model %s (%s, %s%s on %s): %d layers, context %d, KV pool %d blocks x %d tokens",
        name,
        kind,
        "int4 weights, " if quant.quantization == "int4" else "",
        str(dtype).removeprefix("torch."),
        device,
        arch.num_layers,
        max_len,
        blocks.num_usable,
        cfg.cache.block_size,
    )
    return Runtime(
        tokenizer,
        name,
        max_len,
        Scheduler(cfg.scheduler, blocks),
        runner,
        _detokenizer_factory(tokenizer),
        device,
        dtype,
        arch,
        quant.quantization,
        cluster,
    )


def _served_name(kind: str, path: Path | None, cfg: RilletConfig) -> str:
    if kind == "shape":
        return f"shape-{cfg.model.shape}"
    if kind == "synthetic":
        return "synthetic"
    assert path is not None
    return path.stem if path.is_file() else path.name


def _model_runner(
    cfg: RilletConfig,
    model: DecoderModel,
    num_blocks: int,
    eos: tuple[int, ...],
    device: torch.device,
    dtype: torch.dtype,
) -> ModelRunner:
    """The KV pool and runner of `model` (this rank's shard under tensor parallelism)."""
    arch = model.arch
    kv = allocate_kv_cache(arch, num_blocks, cfg.cache.block_size, dtype, device)
    sampler = Sampler(arch.vocab_size, eos, device)
    graphs = _graph_runner(cfg, model, arch, kv, device)
    return ModelRunner(model, kv, sampler, cfg.cache.block_size, device, graphs)


def _graph_runner(
    cfg: RilletConfig, model: DecoderModel, arch: ModelArch, kv: list[KVCache], device: torch.device
) -> GraphRunner | None:
    """The decode step's graph path, logged with the reason: CUDA graphs captured now (CUDA), or
    the compiled step built on a background thread while eager serves (CPU), or none."""
    try:
        mode, why = resolve_decode_mode(cfg.graphs, device)
    except ValueError as exc:
        raise ConfigError("graphs.enabled", str(exc).split(": ", 1)[-1]) from exc
    if mode == "cuda_graphs" and not model.backend.supports_cuda_graphs:
        mode, why = "eager", f"the {model.backend.name} attention backend cannot be captured"
    if mode == "compiled" and not model.backend.graph_safe_decode:
        mode, why = "eager", f"the {model.backend.name} attention backend has no graph-safe decode"
    if mode == "compiled" and cfg.parallel.tensor_parallel_size > 1:
        # The compile runs (and times) the step on a background thread, each rank on its own
        # schedule: its all-reduces would pair with another rank's step, not with its own.
        if cfg.graphs.enabled == "on":
            raise ConfigError(
                "graphs.enabled",
                "'on' on CPU compiles the decode step in the background, which tensor parallelism "
                "(parallel.tensor_parallel_size > 1) cannot do; use 'auto' or 'off'",
            )
        mode, why = "eager", "tensor parallelism on CPU: the ranks cannot compile in the background"
    compile_mode, how = resolve_compile_mode(cfg.graphs.compile_mode, device, model.int4_weights)
    log.info("decode step: %s (%s)", mode.replace("_", " "), why)
    if mode == "eager":
        return None
    log.info("decode step compile mode: %s (%s)", compile_mode, how)
    graphs = GraphRunner(
        DecoderGraphAdapter(model, kv, cfg.cache.block_size),
        replace(cfg.graphs, compile_mode=cast(CompileMode, compile_mode)),
        max_num_seqs=cfg.scheduler.max_num_seqs,
        max_blocks_per_seq=_max_blocks(cfg, arch),
        device=device,
    )
    if mode == "cuda_graphs":
        graphs.capture()
    else:
        base = Path(cfg.model.cache_dir).expanduser() if cfg.model.cache_dir else default_cache_dir()
        where = set_compile_cache_dir(base / "torch-compile")
        log.info("compile caches (Inductor FX graph, AOTAutograd): %s", where)
        graphs.start_compile(background=True)
    return graphs


def _max_blocks(cfg: RilletConfig, arch: ModelArch) -> int:
    max_len = min(cfg.model.max_model_len or arch.max_position, arch.max_position)
    return -(-max_len // cfg.cache.block_size)


def make_backend(
    cfg: RilletConfig, arch: ModelArch, device: torch.device, dtype: torch.dtype
) -> AttentionBackend:
    sel = select_attention_backend(cfg.attention, device)
    for line in sel.log_lines:
        log.info("%s", line)
    if sel.prefill_backend != sel.backend:
        log.info("prefill backend %s is not wired yet: prefill uses %s", sel.prefill_backend, sel.backend)
    if sel.backend == "flashinfer":
        log.info("attention: flashinfer prefill kernels %s", cfg.attention.flashinfer_prefill_backend)
    buckets: tuple[int, ...] = ()
    if device.type == "cuda" and cfg.graphs.enabled != "off":
        buckets = resolve_buckets(cfg.graphs.buckets, cfg.scheduler.max_num_seqs)
    return create_attention_backend(
        sel.backend,
        arch,
        block_size=cfg.cache.block_size,
        dtype=dtype,
        device=device,
        graph_batch_sizes=buckets,
        max_blocks_per_seq=_max_blocks(cfg, arch),
        flashinfer_prefill_backend=cfg.attention.flashinfer_prefill_backend,
    )


def _load_model(
    cfg: RilletConfig,
    kind: str,
    path: Path | None,
    header: GGUFFile | None,
    device: torch.device,
    dtype: torch.dtype,
    quantization: Quantization,
    report: Progress,
) -> tuple[ModelArch, DecoderModel]:
    if kind == "shape":
        arch = shape_arch(cfg.model.shape)
        model = build_model(
            arch, make_backend(cfg, arch, device, dtype), dtype, device, cfg.model.max_model_len
        )
        model.init_random(cfg.model.seed)
        _maybe_quantize(quantization, model)
        return arch, model
    assert path is not None
    if kind == "gguf":
        from rillet.core.loaders.gguf import load_gguf

        arch, weights = load_gguf(path, dtype, cache_dir=cfg.model.cache_dir, header=header)
    else:
        from rillet.core.loaders.hf import load_hf_folder

        arch, weights = load_hf_folder(path, dtype)
    model = build_model(arch, make_backend(cfg, arch, device, dtype), dtype, device, cfg.model.max_model_len)
    model.load_weights(weights)
    _maybe_quantize(quantization, model)
    report("weights", 0.8)
    return arch, model


def _maybe_quantize(quantization: Quantization, model: DecoderModel) -> None:
    if quantization == "int4":
        model.quantize_int4()
        log.info("weights quantized to int4 (group 32) for CPU decode")


def _num_blocks(cfg: RilletConfig, arch: ModelArch, dtype: torch.dtype, device: torch.device) -> int:
    if cfg.cache.num_blocks is not None:
        return cfg.cache.num_blocks
    per_block = 2 * arch.num_layers * cfg.cache.block_size * arch.num_kv_heads * arch.head_dim
    per_block *= torch.finfo(dtype).bits // 8
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = free * cfg.cache.memory_fraction
    else:
        budget = cfg.cache.memory_gb * 2**30
    return max(2, int(budget // per_block))


def _synthetic_runtime(
    cfg: RilletConfig, tok: Tokenizer, name: str, device: torch.device, dtype: torch.dtype, report: Progress
) -> Runtime:
    special = tok.special_token_ids
    table = tok.token_bytes_table()
    # Ordinary ASCII word pieces only, so synthetic text is readable and never hits EOS.
    pool = [
        i
        for i in range(min(len(table), 5000))
        if i not in special and table[i].isascii() and table[i].strip()
    ]
    max_len = cfg.model.max_model_len or 8192
    num_blocks = cfg.cache.num_blocks or 4096
    blocks = BlockManager(num_blocks, cfg.cache.block_size, cfg.cache.prefix_caching)
    report("ready", 1.0)
    m = cfg.model
    runner = SyntheticRunner(m.synthetic_step_ms, pool, m.synthetic_async, cfg.cache.block_size)
    return Runtime(
        tok,
        name,
        max_len,
        Scheduler(cfg.scheduler, blocks),
        runner,
        _detokenizer_factory(tok),
        device,
        dtype,
        None,
    )


def _detokenizer_factory(tok: Tokenizer) -> Callable[[Seq], IncrementalDetokenizer]:
    table = tok.token_bytes_table()
    special = tok.special_token_ids
    eos = tok.eos_token_ids
    text = token_text_table(table, special)

    def make(seq: Seq) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(table, special, seq.params, eos, text)

    return make
