"""The decode step's graph path for one model: CUDA graphs captured at start-up (CUDA), the
compiled step built in the background while eager serves (CPU), or none; and on CPU where the
compiled step is saved (graphs/aot/: `graphs.artifacts`).

A saved step that is missing is built by a child process (core/compile_process.py) from the same
config, so this process keeps serving at full speed meanwhile; `rillet compile` builds them in its
own process (core/compile_ahead.py).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Literal, cast

import torch
from rillet.core.attention.invariant import InvariantAttentionBackend
from rillet.core.config import CompileMode, ConfigError, RilletConfig
from rillet.core.loaders.weights_cache import default_cache_dir
from rillet.core.model.decoder import DecoderModel, KVCache
from rillet.core.runner.graph_adapter import DecoderGraphAdapter
from rillet.graphs.aot.saved import AotPlan
from rillet.graphs.aot.store import GIB, ArtifactStore
from rillet.graphs.compile_modes import resolve_compile_mode, set_compile_cache_dir
from rillet.graphs.decode_mode import resolve_decode_mode
from rillet.graphs.runner import GraphRunner

log = logging.getLogger(__name__)

# graphs.short_prefill's cap for a model with soft-capped attention scores (Gemma 2), whose compiled
# attention is the reductions: ~3 us per query x context token on the default model's shapes
SOFTCAP_SHORT_PREFILL = 16


def cache_base(cfg: RilletConfig) -> Path:
    return Path(cfg.model.cache_dir).expanduser() if cfg.model.cache_dir else default_cache_dir()


def graph_runner(
    cfg: RilletConfig,
    model: DecoderModel,
    kv: list[KVCache],
    device: torch.device,
    max_blocks_per_seq: int,
    in_process: bool = False,
) -> GraphRunner | None:
    """The decode step's graph runner (not started: start_graphs), logged with the reason; None
    when steps run eager. `in_process`: missing saved steps are built by this process (`rillet
    compile`), not by a child."""
    mode, why = decode_mode(cfg, model, device)
    log.info("decode step: %s (%s)", mode.replace("_", " "), why)
    if mode == "eager":
        return None
    compile_mode, how = resolve_compile_mode(cfg.graphs.compile_mode, device, model.int4_weights)
    log.info("decode step compile mode: %s (%s)", compile_mode, how)
    plan = None
    if mode == "compiled":
        base = cache_base(cfg)
        try:
            base.mkdir(parents=True, exist_ok=True)  # also where TORCHINDUCTOR_CACHE_DIR points elsewhere
            where = set_compile_cache_dir(base / "torch-compile")
        except OSError as exc:  # a read-only home or volume: one line naming the key, not a traceback
            raise ConfigError(
                "model.cache_dir",
                f"cannot write the compiled steps' caches under {base}: {exc.strerror}"
                " (a writable folder, or graphs.enabled off)",
            ) from exc
        log.info("compile caches (Inductor FX graph, AOTAutograd): %s", where)
        plan = artifact_plan(cfg, model, in_process)
    return GraphRunner(
        DecoderGraphAdapter(model, kv, cfg.cache.block_size),
        replace(
            cfg.graphs, compile_mode=cast(CompileMode, compile_mode), small_batch=small_batch(cfg, model)
        ),
        max_num_seqs=cfg.scheduler.max_num_seqs,
        max_blocks_per_seq=max_blocks_per_seq,
        device=device,
        verify_queries=verify_queries(cfg, model, mode),
        verify_max_rows=cfg.speculative.max_batch,
        plan=plan,
    )


AMX_SMALL_BATCH = 1  # graphs.small_batch auto with rillet's int4 kernel and an aten copy (AMX)


def small_batch(cfg: RilletConfig, model: DecoderModel) -> int | Literal["auto"]:
    """graphs.small_batch, auto resolved where the int4 projections are rillet's kernel: with an
    aten copy of the codes (an AMX CPU) single rows take the small-batch step through torch's
    kernel, faster there at one row (Int4Weight), and more rows the tiles; without one (no AMX)
    no second step: the kernel is a custom op that every step calls alike, and the small-batch
    step exists to keep Inductor's int4 template off few rows."""
    if cfg.graphs.small_batch != "auto" or not model.int4_rows_kernel:
        return cfg.graphs.small_batch
    return AMX_SMALL_BATCH if model.int4_aten_copy else 0


def start_graphs(graphs: GraphRunner) -> None:
    """CUDA: capture now. CPU: the compiled step, looked up or built in the background."""
    if graphs.mode == "cuda_graphs":
        graphs.capture()
    else:
        graphs.start_compile(background=True)


def artifact_plan(cfg: RilletConfig, model: DecoderModel, in_process: bool = False) -> AotPlan | None:
    """Where the compiled CPU step is saved and who builds it; None: torch.compile at each start
    (graphs.artifacts off, or LoRA buffers, which the step reads and a saved step would freeze)."""
    if cfg.graphs.artifacts == "off":
        return None
    if model.lora is not None:
        log.info("compiled step not saved: LoRA adapters (torch.compile at each start)")
        return None
    from rillet.core.compile_process import CompileProcess  # the child's command line, lazily

    store = ArtifactStore(cache_base(cfg) / "compiled", int(cfg.graphs.artifacts_max_gb * GIB))
    log.info("compiled steps are saved under %s (graphs.artifacts)", store.root)
    if in_process:
        return AotPlan(store)
    return AotPlan(store, CompileProcess(cfg, torch.get_num_threads(), store.root / "build.log"))


def verify_queries(cfg: RilletConfig, model: DecoderModel, mode: str) -> int:
    """Q of the multi-query step's graph (graphs/verify.py): 1 + speculative.num_tokens queries a
    row for speculative verify steps, for up to speculative.max_batch rows; on the compiled CPU
    step at least graphs.short_prefill (short prefill steps run through it too: model_runner.py).
    0 (no such graph) under tensor parallelism (the ranks run the flat layout, eager), for a
    backend without a verify step, or when neither uses it."""
    sc = cfg.speculative
    backend = model.backend
    if cfg.parallel.tensor_parallel_size > 1:
        return 0
    if not backend.graph_safe_decode and not hasattr(backend, "begin_verify"):
        return 0
    spec = 1 + sc.num_tokens if sc.enabled else 0
    # not with LoRA buffers (the multi-query step does not read them); soft-capped scores take
    # the attention's reductions, compute-bound past a few queries a row (paged_verify.py)
    short = cfg.graphs.short_prefill if mode == "compiled" and model.lora is None else 0
    if model.arch.attn_softcap is not None:
        short = min(short, SOFTCAP_SHORT_PREFILL)
    return max(spec, short)


def decode_mode(cfg: RilletConfig, model: DecoderModel, device: torch.device) -> tuple[str, str]:
    try:
        mode, why = resolve_decode_mode(cfg.graphs, device)
    except ValueError as exc:
        raise ConfigError("graphs.enabled", str(exc).split(": ", 1)[-1]) from exc
    backend = model.backend
    if isinstance(backend, InvariantAttentionBackend) and mode != "eager":
        if cfg.graphs.enabled == "on":
            raise ConfigError(
                "graphs.enabled",
                "'on' compiles the decode step, which engine.deterministic 'on' does not serve "
                "(its fused kernels round differently from the eager step); use 'auto' or 'off'",
            )
        return "eager", "engine.deterministic on: the eager step only, from the first request on"
    if mode == "cuda_graphs" and not backend.supports_cuda_graphs:
        return "eager", f"the {backend.name} attention backend cannot be captured"
    if mode == "compiled" and not backend.graph_safe_decode:
        return "eager", f"the {backend.name} attention backend has no graph-safe decode"
    if mode == "compiled" and cfg.parallel.tensor_parallel_size > 1:
        # The compile runs (and times) the step on a background thread, each rank on its own
        # schedule: its all-reduces would pair with another rank's step, not with its own.
        if cfg.graphs.enabled == "on":
            raise ConfigError(
                "graphs.enabled",
                "'on' on CPU compiles the decode step in the background, which tensor parallelism "
                "(parallel.tensor_parallel_size > 1) cannot do; use 'auto' or 'off'",
            )
        return "eager", "tensor parallelism on CPU: the ranks cannot compile in the background"
    return mode, why
