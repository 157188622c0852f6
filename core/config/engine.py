"""`scheduler`, `engine`, `graphs`, `attention`, `structured`: how the engine runs a step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from rillet.core.config.errors import check

AttentionBackendName = Literal["auto", "torch", "flashinfer"]
PrefillBackendName = Literal["auto", "torch", "flashinfer", "xformers"]
# flashinfer's own prefill kernels. auto lets flashinfer choose per plan(): FA3 on Hopper (sm90, CUDA
# >= 12.3, head dims 64/128) whenever the longest query in the step exceeds 64 tokens.
FlashinferPrefillKernels = Literal["fa2", "fa3", "auto"]
CompileMode = Literal["auto", "none", "default", "reduce-overhead", "max-autotune-no-cudagraphs"]
SchedulingPolicy = Literal["fcfs", "priority"]


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # running batch size cap
    max_num_batched_tokens: int = 2048  # per-step token budget (prefill chunks + decodes)
    max_waiting: int = 1024  # admission control: waiting queue bound (429 past it)
    # model.task both: while chat requests run, embeddings take at most this share of the engine's
    # time (core/engine/scheduling/embed_share.py); 1 = no limit (they compete as any prefill). Chat keeps
    # at most 1 - share of its speed, less the mixed steps' own cost: 0.2 measured 0.80-0.82x alone
    # (on the 0.8 line), 0.15 0.81-0.86x (bench/serving/embeddings.py)
    embed_share: float = 0.15
    # fcfs: arrival order (a request's `priority` other than 0 is refused, as vLLM does); priority:
    # waiting requests by (priority, arrival), lower first, a better one taking a worse running
    # one's batch place (core/engine/scheduling/priority.py)
    policy: SchedulingPolicy = "fcfs"
    # policy priority: a request's priority improves by one for every max_wait_s it has been in the
    # engine, so a low one is not starved by a stream of better ones; None: no aging (vLLM's)
    max_wait_s: float | None = 30.0

    def __post_init__(self) -> None:
        check(self.max_num_seqs >= 1, "scheduler.max_num_seqs", "must be >= 1")
        check(self.max_num_batched_tokens >= 1, "scheduler.max_num_batched_tokens", "must be >= 1")
        check(
            self.max_num_batched_tokens >= self.max_num_seqs,
            "scheduler.max_num_batched_tokens",
            "must be >= scheduler.max_num_seqs (every running sequence needs one token per step)",
        )
        check(self.max_waiting >= 1, "scheduler.max_waiting", "must be >= 1")
        check(0 < self.embed_share <= 1, "scheduler.embed_share", "must be in (0, 1]")
        check(
            self.policy in get_args(SchedulingPolicy),
            "scheduler.policy",
            f"must be fcfs or priority, got {self.policy!r}",
        )
        check(
            self.max_wait_s is None or self.max_wait_s > 0,
            "scheduler.max_wait_s",
            f"must be > 0 or null (no aging), got {self.max_wait_s}",
        )


MAX_OVERLAP_DEPTH = 2


@dataclass(frozen=True)
class EngineConfig:
    # Overlapped steps: launch step N+1 (its decode inputs read N's tokens on the device) before
    # the host post-processes step N. auto = on for CUDA and for the asynchronous null engine, off
    # for CPU models (there torch runs a step on the calling thread: nothing to overlap).
    overlap: Literal["auto", "on", "off"] = "auto"
    # Steps in flight when overlap is on: 1 = launch N+1, then land N; 2 = launch N+2 before
    # landing N, so the device has a step queued behind the one it runs while the host lands,
    # publishes and schedules (host work that waits for the GIL then delays no launch). A
    # finishing sequence wastes `overlap_depth` tokens of compute, and a new request's prefill
    # queues behind that many steps.
    overlap_depth: int = 1
    # Deterministic inference (core/determinism/): a request's tokens and logprobs do not depend on
    # its batch, its prefill chunking or the prefix cache. on = batch-invariant kernels and the
    # eager decode step only (CPU); auto = on only where it measured <= 5 % slower, which is nowhere
    # yet (CPU: 1.2-2x, bench/engine/determinism_cost.py; GPU: not measured), so auto is off.
    deterministic: Literal["auto", "on", "off"] = "auto"

    def __post_init__(self) -> None:
        for key in ("overlap", "deterministic"):
            check(getattr(self, key) in ("auto", "on", "off"), f"engine.{key}", "must be auto, on or off")
        check(
            1 <= self.overlap_depth <= MAX_OVERLAP_DEPTH,
            "engine.overlap_depth",
            f"must be from 1 to {MAX_OVERLAP_DEPTH}",
        )


MAX_SHORT_PREFILL = 4096
MAX_SMALL_BATCH = 16


@dataclass(frozen=True)
class GraphConfig:
    # decode step as a graph: CUDA graphs on CUDA, the torch.compile'd step on CPU (auto: if faster)
    enabled: Literal["auto", "on", "off"] = "auto"
    buckets: tuple[int, ...] = ()  # batch-size buckets; () = 1, 2, 4, 8, then steps of 8/16
    # auto: max-autotune-no-cudagraphs for CPU models with int4 weights (Inductor's int4 GEMM
    # template, weights frozen: graphs/compiled.py), default otherwise
    compile_mode: CompileMode = "auto"
    # CPU: the compiled step saved as an AOTInductor package under model.cache_dir/compiled and
    # loaded by the next start (graphs/aot/); off: torch.compile at every start
    artifacts: Literal["on", "off"] = "on"
    # GiB the saved steps may take under model.cache_dir/compiled: a save past it deletes the least
    # recently used ones (never this process's); 0: no bound. Steps of another config (KV dtype,
    # model, threads) are kept within it; those of older code or torch are deleted at once
    artifacts_max_gb: float = 8.0
    # CPU, compiled step: a prefill step whose rows each feed at most this many tokens (a prompt's
    # tail after a prefix-cache hit, a prompt of up to this length) runs through the compiled
    # multi-query step (the speculative verify step's graph, built for this even with speculation
    # off), not eager; 0: prefill is always eager
    short_prefill: int = 1024
    # CPU, saved steps in an autotuned mode (max-autotune*): decode steps of at most this many rows
    # run a second saved decode step whose GEMMs are aten's kernels (int4: a pass over the weights
    # per 4 rows, dequantized in registers) instead of the autotuned picks, which the example's 2
    # rows settle on Inductor's AMX template (flat in the rows: it dequantizes every weight to a
    # bf16 buffer); measured on the default model, bench/RESULTS.md 2026-12-03: 8.93 -> 5.52 ms a
    # batch-1 step, slower from 5 rows on. 0: one decode step for every row count; auto: with
    # rillet's int4 kernel 1 where the CPU has AMX (its int4 GEMMs torch's kernel on an aten copy
    # of the codes: core/graph_setup.py small_batch) and 0 without; with torch's 4 where the CPU
    # has AMX, else 0 (graphs/aot/step.py small_batch_rows)
    small_batch: int | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        check(all(b >= 1 for b in self.buckets), "graphs.buckets", "every bucket must be >= 1")
        check(
            self.small_batch == "auto" or 0 <= self.small_batch <= MAX_SMALL_BATCH,
            "graphs.small_batch",
            f"must be auto or in 0..{MAX_SMALL_BATCH}, got {self.small_batch}",
        )
        check(
            self.short_prefill == 0 or 2 <= self.short_prefill <= MAX_SHORT_PREFILL,
            "graphs.short_prefill",
            f"must be 0 (off) or in 2..{MAX_SHORT_PREFILL}, got {self.short_prefill}",
        )
        check(len(set(self.buckets)) == len(self.buckets), "graphs.buckets", "must not repeat")
        check(self.artifacts_max_gb >= 0, "graphs.artifacts_max_gb", "must be >= 0 (0: no bound)")


@dataclass(frozen=True)
class AttentionConfig:
    backend: AttentionBackendName = "auto"  # decode (and prefill unless prefill_backend says)
    prefill_backend: PrefillBackendName = "auto"
    # the kernels of flashinfer's prefill wrapper; fa2 until FA3 has been measured on the device
    flashinfer_prefill_backend: FlashinferPrefillKernels = "fa2"

    def __post_init__(self) -> None:
        allowed = get_args(FlashinferPrefillKernels)
        check(
            self.flashinfer_prefill_backend in allowed,
            "attention.flashinfer_prefill_backend",
            f"must be one of {', '.join(allowed)}, got {self.flashinfer_prefill_backend!r}",
        )


@dataclass(frozen=True)
class StructuredConfig:
    cache_size: int = 128  # compiled grammars kept (least recently used dropped first)
    # A grammar (JSON Schema, tools) whose compile takes longer is refused with a 400.
    compile_timeout_s: float = 5.0
    # Plain greedy rows sample unmasked and fill a mask only when the grammar refuses the token
    # (same tokens as a full mask; core/structured/masks.py). auto = on for CPU models, where the
    # fill's CPU time comes out of the forward's; off on CUDA (spare cores fill during the forward,
    # and the check would read the tokens back every step).
    lazy_masks: Literal["auto", "on", "off"] = "auto"
    # JSON layout in constrained outputs (core/structured/json_style.py): flexible = newlines and
    # indentation as models write them, at most 38 bytes of whitespace per gap; compact = one line.
    whitespace: Literal["flexible", "compact"] = "flexible"
    # tool_choice required with parallel_tool_calls (the default): at most this many calls per
    # answer (unbounded, a small model repeated the same call until max_tokens)
    max_tool_calls: int = 8
    # The repetition penalty of constrained requests that set no penalty of their own (1.0 = none):
    # under a grammar a small model's greedy output looped until max_tokens on 8 of 30 JSON tasks
    # (core/structured/defaults.py)
    repetition_penalty: float = 1.1

    def __post_init__(self) -> None:
        check(self.cache_size >= 1, "structured.cache_size", "must be >= 1")
        check(
            0.0 < self.repetition_penalty <= 10.0,
            "structured.repetition_penalty",
            f"must be in (0, 10], got {self.repetition_penalty}",
        )
        check(self.lazy_masks in ("auto", "on", "off"), "structured.lazy_masks", "must be auto, on or off")
        check(self.compile_timeout_s > 0, "structured.compile_timeout_s", "must be > 0")
        check(self.max_tool_calls >= 1, "structured.max_tool_calls", "must be >= 1")
