"""From a `RilletConfig` to everything the engine runs: tokenizer, model, KV pool, scheduler, runner.

This is the assembly of rank 0: the pieces come from build.py (shared with tensor-parallel worker
ranks), and under tensor parallelism the other ranks are started and joined here (distributed/).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from rillet.core.attention.kv_cache import describe_pool, resolve_kv_dtype
from rillet.core.build import (
    ModelSource,
    Precision,
    Progress,
    kv_capacity,
    load_model,
    load_tokenizer,
    max_model_len,
    model_runner,
    resolve_device,
    resolve_precision,
    resolve_source,
    served_name,
    set_threads,
)
from rillet.core.config import CacheConfig, RilletConfig
from rillet.core.determinism import startup as deterministic
from rillet.core.embed_build import EmbedSetup, load_encoder, resolve_tasks
from rillet.core.embedding import Pooling, Task
from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.detokenizer import IncrementalDetokenizer, token_text_table
from rillet.core.engine.scheduler import Scheduler
from rillet.core.lora.registry import LoraRegistry
from rillet.core.lora.setup import attach_lora, refuse_unsupported
from rillet.core.model.arch import ModelArch
from rillet.core.model.decoder import DecoderModel
from rillet.core.runner.base import Runner
from rillet.core.runner.inflight.device_timeline import DeviceTimeline
from rillet.core.runner.pooling import ChunkPooler
from rillet.core.runner.synthetic import SYNTHETIC_EMBEDDING_SIZE, SyntheticRunner
from rillet.core.sequence import Seq
from rillet.core.spec.setup import build_speculator
from rillet.core.spec.speculator import Speculator
from rillet.core.tokenizer.tokenizer import Tokenizer
from rillet.core.vision.attach import attach_vision, refuse_vision
from rillet.core.vision.setup import VisionModel

if TYPE_CHECKING:
    from rillet.core.distributed.cluster import TPCluster

log = logging.getLogger(__name__)

DetokenizerFactory = Callable[[Seq], IncrementalDetokenizer]


@dataclass(frozen=True)
class Runtime:
    tokenizer: Tokenizer
    model_name: str
    max_model_len: int
    scheduler: Scheduler
    runner: Runner
    make_detokenizer: DetokenizerFactory
    device: torch.device
    dtype: torch.dtype
    arch: ModelArch | None  # None for the synthetic model
    quantization: str = "none"  # resolved (never auto): int4 = the weights run as Int4Weight
    cluster: TPCluster | None = None  # tensor parallelism: the other ranks (rank 0's view)
    tasks: frozenset[Task] = frozenset({"generate"})  # model.task, resolved (embed_build.py)
    pooling: Pooling | None = None  # how embeddings are pooled; None: the model does not embed
    embedding_size: int | None = None  # components of an embedding (before `dimensions`)
    encoder: bool = False  # embeddings run whole, without KV (a BERT-family encoder)
    speculator: Speculator | None = None  # speculative decoding (core/spec/), None when off
    lora: LoraRegistry | None = None  # LoRA adapters (core/lora/), None when lora asks for none
    timeline: DeviceTimeline | None = None  # CUDA: the device's busy / idle time across steps
    deterministic: bool = False  # engine.deterministic, resolved: batch-invariant kernels serve
    vision: VisionModel | None = None  # a vision-language model's image side (core/vision/)


def load_runtime(cfg: RilletConfig, progress: Progress | None = None) -> Runtime:
    report: Progress = progress or (lambda stage, frac: None)
    device = resolve_device(cfg.model.device)
    invariant = deterministic.begin(cfg, device)  # before anything runs MKL: it may still be made strict
    set_threads(cfg.model.num_threads)
    src = resolve_source(cfg)
    precision = resolve_precision(cfg, src, device)
    if cfg.model.quantization == "auto":
        log.info("quantization auto -> %s: %s", precision.quantization, precision.reason)
    setup = resolve_tasks(cfg, src)
    report("tokenizer", 0.0)
    tokenizer = load_tokenizer(src)
    name = served_name(cfg, src)
    if src.kind == "synthetic":
        refuse_unsupported(cfg, "the synthetic model")
        return _synthetic_runtime(cfg, tokenizer, name, device, precision.dtype, report, setup)
    report("weights", 0.1)
    if setup.encoder:
        refuse_unsupported(cfg, "an encoder (embeddings only)")
        return _encoder_runtime(cfg, src, setup, tokenizer, name, device, precision, report)
    if "generate" not in setup.tasks:  # embeddings never decode: no decode step to compile
        cfg = replace(cfg, graphs=replace(cfg.graphs, enabled="off"))
    refuse_vision(cfg, src)
    with _cluster(cfg, src, device, precision) as cluster:
        model = _load(cfg, src, device, precision, cluster, report)
        blocks = _block_pool(cfg, model, cluster, precision.dtype, device)
        scheduler = Scheduler(cfg.scheduler, blocks)
        lora = attach_lora(cfg, model, scheduler, name)  # before the decode step compiles
        report("kv cache", 0.9)
        eos = tuple(sorted(set(tokenizer.eos_token_ids) | set(model.arch.eos_token_ids)))
        own = model_runner(cfg, model, blocks.num_blocks, eos, device, precision.dtype)
        vision = attach_vision(cfg, model, own, scheduler, device)
        if setup.pooling is not None:
            own.pooler = ChunkPooler(setup.pooling)
        runner: Runner = own if cluster is None else cluster.wrap(own)
        max_len = max_model_len(cfg, model.arch)
        if "generate" not in setup.tasks and src.st is not None and src.st.max_seq_length is not None:
            max_len = min(max_len, src.st.max_seq_length)  # as sentence-transformers cuts its inputs
        max_len = fit_pool(max_len, blocks)
        spec = None
        if "generate" in setup.tasks:  # embeddings never decode: nothing to speculate
            spec = build_speculator(
                cfg, model, eos, max_len, device, precision.dtype, blocks.num_blocks, tokenizer
            )
    report("ready", 1.0)
    _log_model(name, src, precision, device, model.arch, max_len, blocks, cfg.cache)
    return Runtime(
        tokenizer=tokenizer,
        model_name=name,
        max_model_len=max_len,
        scheduler=scheduler,
        runner=runner,
        make_detokenizer=detokenizer_factory(tokenizer, eos),
        device=device,
        dtype=precision.dtype,
        arch=model.arch,
        quantization=precision.quantization,
        cluster=cluster,
        tasks=setup.tasks,
        pooling=setup.pooling,
        embedding_size=model.arch.hidden_size if setup.pooling is not None else None,
        speculator=spec,
        lora=lora,
        timeline=own.timeline,
        deterministic=invariant,
        vision=vision,
    )


def _encoder_runtime(
    cfg: RilletConfig,
    src: ModelSource,
    setup: EmbedSetup,
    tokenizer: Tokenizer,
    name: str,
    device: torch.device,
    precision: Precision,
    report: Progress,
) -> Runtime:
    """A BERT-family encoder: its own runner, and a pool of no KV blocks (only the reserved one)."""
    parts = load_encoder(cfg, src, setup, device, precision, tokenizer.vocab_size)
    report("ready", 1.0)
    return Runtime(
        tokenizer=tokenizer,
        model_name=name,
        max_model_len=parts.max_model_len,
        scheduler=Scheduler(cfg.scheduler, BlockManager(2, cfg.cache.block_size, False)),
        runner=parts.runner,
        make_detokenizer=detokenizer_factory(tokenizer),
        device=device,
        dtype=precision.dtype,
        arch=None,
        tasks=setup.tasks,
        pooling=setup.pooling,
        embedding_size=parts.embedding_size,
        encoder=True,
    )


@contextmanager
def _cluster(
    cfg: RilletConfig, src: ModelSource, device: torch.device, precision: Precision
) -> Iterator[TPCluster | None]:
    """Tensor parallelism: the other ranks, started before this rank loads (they load meanwhile)
    and stopped if anything below fails; None with one rank."""
    if cfg.parallel.tensor_parallel_size == 1:
        yield None
        return
    from rillet.core.distributed.cluster import TPCluster

    cluster = TPCluster.start(cfg, src.kind, src.path, src.header, device, precision.quantization)
    try:
        yield cluster
    except BaseException:
        cluster.close(graceful=False)
        raise


def _load(
    cfg: RilletConfig,
    src: ModelSource,
    device: torch.device,
    precision: Precision,
    cluster: TPCluster | None,
    report: Progress,
) -> DecoderModel:
    if cluster is None:
        return load_model(cfg, src, device, precision, report)
    # this rank's shard; the workers load theirs meanwhile
    return cluster.load_model(src.kind, src.path, src.header, precision.dtype, precision.quantization)


def _block_pool(
    cfg: RilletConfig,
    model: DecoderModel,
    cluster: TPCluster | None,
    dtype: torch.dtype,
    device: torch.device,
) -> BlockManager:
    num_blocks = kv_capacity(cfg, model.arch, dtype, device)
    if cluster is not None:  # every rank's pool has the same blocks: the smallest rank's room
        num_blocks = cluster.agree_blocks(model, num_blocks)
    return BlockManager(num_blocks, cfg.cache.block_size, cfg.cache.prefix_caching)


def fit_pool(max_len: int, blocks: BlockManager) -> int:
    """The context length a sequence can reach in this pool: one that needs more blocks than the
    pool has would preempt itself forever (the scheduler frees room by preempting others, never
    past its own need), and hold up the queue behind it. So the context is capped at the pool."""
    room = blocks.num_usable * blocks.block_size
    if max_len <= room:
        return max_len
    log.warning(
        "the KV pool holds %d tokens, fewer than the context length %d: prompt + max_tokens is "
        "limited to %d (raise cache.num_blocks, cache.memory_gb or cache.memory_fraction)",
        room,
        max_len,
        room,
    )
    return room


def _log_model(
    name: str,
    src: ModelSource,
    precision: Precision,
    device: torch.device,
    arch: ModelArch,
    max_len: int,
    blocks: BlockManager,
    cache: CacheConfig,
) -> None:
    kv_dtype = resolve_kv_dtype(cache.dtype, precision.dtype, device)
    log.info(
        "model %s (%s, %s%s on %s): %d layers, context %d, %s",
        name,
        src.kind,
        "int4 weights, " if precision.quantization == "int4" else "",
        str(precision.dtype).removeprefix("torch."),
        device,
        arch.num_layers,
        max_len,
        describe_pool(arch, blocks.num_usable, cache.block_size, kv_dtype),
    )


def _synthetic_runtime(
    cfg: RilletConfig,
    tok: Tokenizer,
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    report: Progress,
    setup: EmbedSetup,
) -> Runtime:
    special = tok.special_token_ids
    table = tok.token_bytes_table()
    # Ordinary ASCII word pieces only, so synthetic text is readable and never hits EOS.
    pool = [
        i
        for i in range(min(len(table), 5000))
        if i not in special and table[i].isascii() and table[i].strip()
    ]
    blocks = BlockManager(cfg.cache.num_blocks or 4096, cfg.cache.block_size, cfg.cache.prefix_caching)
    report("ready", 1.0)
    m = cfg.model
    return Runtime(
        tokenizer=tok,
        model_name=name,
        max_model_len=fit_pool(m.max_model_len or 8192, blocks),
        scheduler=Scheduler(cfg.scheduler, blocks),
        runner=SyntheticRunner(
            m.synthetic_step_ms, pool, m.synthetic_async, cfg.cache.block_size, m.synthetic_host_ms
        ),
        make_detokenizer=detokenizer_factory(tok),
        device=device,
        dtype=dtype,
        arch=None,
        tasks=setup.tasks,
        pooling=setup.pooling,
        embedding_size=SYNTHETIC_EMBEDDING_SIZE if setup.pooling is not None else None,
    )


def detokenizer_factory(tok: Tokenizer, eos: tuple[int, ...] | None = None) -> DetokenizerFactory:
    """`eos`: the ids that end a sequence, the sampler's (the tokenizer's and the model config's):
    one the sampler bans as EOS under min_tokens must also stop the sequence once drawn."""
    table = tok.token_bytes_table()
    special = tok.special_token_ids
    eos = tok.eos_token_ids if eos is None else eos
    text = token_text_table(table, special)

    def make(seq: Seq) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(table, special, seq.params, eos, text)

    return make
