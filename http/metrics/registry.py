"""Prometheus metrics of one app, in its own CollectorRegistry (several servers may share a process).

Per-token work is kept to the dispatcher's batch: one `inc` per engine step for generated tokens,
one histogram observation per request per step for latencies, into lock-free loop-owned
histograms (loop_histogram.py). Engine gauges are read from `engine.stats()` only when /metrics is
scraped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from rillet.http.metrics.loop_histogram import LoopHistogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)

# (name, help, kind, value); kind is "gauge" or "counter"
Sample = tuple[str, str, str, float]


class TokenClock(Protocol):
    """A request's token timing, kept on the request itself (the stream layer's RequestStream)."""

    arrival: float
    first_token_at: float | None
    last_token_at: float
    last_step: int  # engine step of the latest token (one ITL observation per step)


class _Snapshot(Collector):
    """Engine-side numbers, computed at scrape time."""

    def __init__(self, snapshot: Callable[[], list[Sample]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        for name, doc, kind, value in self._snapshot():
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            yield family(name, doc, value=value)


class Metrics:
    def __init__(self, snapshot: Callable[[], list[Sample]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter(
            "rillet_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter("rillet_prompt_tokens", "Prompt tokens of accepted requests", registry=r)
        # LoRA: per adapter (labels are adapter names: bounded by what is loaded, since an unload
        # drops its series: forget_adapter)
        self.lora_requests = Counter(
            "rillet_lora_requests", "Accepted generation requests by LoRA adapter", ["adapter"], registry=r
        )
        self.lora_tokens = Counter(
            "rillet_lora_tokens",
            "Tokens by LoRA adapter and kind (prompt, generation)",
            ["adapter", "kind"],
            registry=r,
        )
        self._lora_live: set[str] = set()  # adapters with series (until forget_adapter)
        self.ttft = LoopHistogram(
            "rillet_time_to_first_token_seconds", "Arrival to first token", _TTFT_BUCKETS
        )
        self.itl = LoopHistogram(
            "rillet_inter_token_latency_seconds",
            "Time between a request's consecutive tokens",
            _LATENCY_BUCKETS,
        )
        self.e2e = LoopHistogram("rillet_request_latency_seconds", "Arrival to last token", _E2E_BUCKETS)
        for h in (self.ttft, self.itl, self.e2e):
            r.register(h)
        r.register(_Snapshot(snapshot))

    def count_adapter(self, adapter: str, prompt_tokens: int) -> None:
        """An accepted request for a LoRA adapter (its generated tokens: `adapter_tokens`)."""
        self._lora_live.add(adapter)
        self.lora_requests.labels(adapter).inc()
        self.lora_tokens.labels(adapter, "prompt").inc(prompt_tokens)

    def adapter_tokens(self, adapter: str, generated: int) -> None:
        """A request's generated tokens, at its end: none once its adapter was unloaded meanwhile
        (they would bring the forgotten adapter's series back for good)."""
        if adapter in self._lora_live:
            self.lora_tokens.labels(adapter, "generation").inc(generated)

    def forget_adapter(self, adapter: str) -> None:
        """An unloaded adapter's series leave /metrics (many adapters loaded and unloaded in turn
        would otherwise grow it without bound)."""
        self._lora_live.discard(adapter)
        for counter, labels in (
            (self.lora_requests, (adapter,)),
            (self.lora_tokens, (adapter, "prompt")),
            (self.lora_tokens, (adapter, "generation")),
        ):
            with contextlib.suppress(KeyError):
                counter.remove(*labels)

    def token_times(self, stream: TokenClock, now: float, num_tokens: int, step: int) -> None:
        """Called by the dispatcher once per delta with tokens; `now` is shared by the whole routing
        pass, which may hold several engine steps (their later tokens then count a 0 s gap)."""
        if stream.first_token_at is None:
            stream.first_token_at = now
            self.ttft.observe(now - stream.arrival)
        elif step != stream.last_step:  # n > 1: the other choices of the same step add nothing
            self.itl.observe((now - stream.last_token_at) / num_tokens)
        stream.last_token_at = now
        stream.last_step = step

    def render(self) -> bytes:
        return generate_latest(self.registry)


def dispatch_samples(tokens: int, cpu_seconds: float, parks: int = 0, parked_s: float = 0.0) -> list[Sample]:
    """The dispatcher's loop-owned counters (no lock per token: read here, at scrape time), with
    the engine gate's parks (stream.engine_first; 0 without one)."""
    return [
        ("rillet_generation_tokens", "Tokens generated (routed to their requests)", "counter", tokens),
        (
            "rillet_dispatch_cpu_seconds",
            "Event-loop thread CPU time spent routing engine steps and writing direct SSE events",
            "counter",
            cpu_seconds,
        ),
        (
            "rillet_loop_gate_parks",
            "Times the event loop gave way to the engine's host work",
            "counter",
            parks,
        ),
        (
            "rillet_loop_gate_parked_seconds",
            "Event-loop time parked while the engine did its host work (stream.engine_first)",
            "counter",
            parked_s,
        ),
    ]


def engine_samples(stats: Any, wakeups: int, active_streams: int) -> list[Sample]:
    """Gauges and counters from an `EngineStats` (see core/engine/engine.py)."""
    hit = stats.cached_prompt_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
    usage = stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0
    return [
        ("rillet_num_requests_running", "Sequences running in the engine", "gauge", stats.running),
        (
            "rillet_num_requests_waiting",
            "Sequences waiting for admission (queue depth)",
            "gauge",
            stats.waiting,
        ),
        ("rillet_kv_blocks_used", "KV cache blocks in use", "gauge", stats.kv_blocks_used),
        ("rillet_kv_blocks_total", "KV cache blocks in the pool", "gauge", stats.kv_blocks_total),
        ("rillet_kv_cache_usage_ratio", "Fraction of KV blocks in use", "gauge", usage),
        (
            "rillet_kv_cache_tokens_total",
            "Tokens the KV pool holds (blocks x block size; cache.dtype decides how many fit its memory)",
            "gauge",
            stats.kv_tokens_total,
        ),
        (
            "rillet_prefix_cache_hit_rate",
            "Prompt tokens served from the prefix cache / prompt tokens",
            "gauge",
            hit,
        ),
        ("rillet_prefix_cache_blocks", "Blocks held by the prefix cache", "gauge", stats.cached_blocks),
        # Token counters (vLLM's prefix_cache_queries / _hits): a hit rate over any window, not
        # only since start, is the ratio of their increases.
        (
            "rillet_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            "counter",
            stats.prompt_tokens,
        ),
        (
            "rillet_prefix_cache_hits",
            "Prompt tokens found in the prefix cache",
            "counter",
            stats.cached_prompt_tokens,
        ),
        ("rillet_engine_steps", "Engine steps run", "counter", stats.steps),
        (
            "rillet_num_preemptions",
            "Sequences preempted for KV blocks or a better priority's batch place (freed, recomputed "
            "when readmitted)",
            "counter",
            stats.preemptions,
        ),
        (
            "rillet_deterministic",
            "1 when engine.deterministic is on (batch-invariant kernels, the eager step), else 0",
            "gauge",
            float(stats.deterministic),
        ),
        ("rillet_engine_busy_seconds", "Wall time spent in engine steps", "counter", stats.busy_seconds),
        (
            "rillet_engine_device_wait_seconds",
            "Of the engine's busy time: blocked waiting for launched steps' tokens (busy - wait = host work)",
            "counter",
            stats.device_wait_seconds,
        ),
        (
            "rillet_device_busy_seconds",
            "CUDA: the device's span of each engine step (first op to the tokens' copy)",
            "counter",
            getattr(stats, "device_busy_seconds", 0.0),
        ),
        (
            "rillet_device_prep_seconds",
            "CUDA: of the device's busy time, before each step's forward (inputs, or waiting for the host)",
            "counter",
            getattr(stats, "device_prep_seconds", 0.0),
        ),
        (
            "rillet_device_late_launches",
            "CUDA: launches finished after the device had finished the step before (host-bound steps)",
            "counter",
            getattr(stats, "device_late_launches", 0),
        ),
        (
            "rillet_device_idle_seconds",
            "CUDA: device idle between steps while the next was due (the host launched it late)",
            "counter",
            getattr(stats, "device_idle_seconds", 0.0),
        ),
        ("rillet_ring_wakeups", "Engine -> event loop wake-ups", "counter", wakeups),
        (
            "rillet_handoff_timeouts",
            "Model runs started after waiting stream.handoff_timeout_ms for a lagging event loop",
            "counter",
            stats.handoff_timeouts,
        ),
        (
            "rillet_handoff_wait_seconds",
            "Engine time spent waiting for the event loop to take a step's output before a model run",
            "counter",
            getattr(stats, "handoff_wait_seconds", 0.0),
        ),
        ("rillet_active_streams", "Requests the front end is serving", "gauge", active_streams),
        *_spec_samples(stats),
    ]


def _spec_samples(stats: Any) -> list[Sample]:
    """Speculative decoding: counters (a rate over a window is the ratio of their increases) and
    the ratios since start. Engines without it (the test doubles) report zeros."""
    drafted = getattr(stats, "spec_drafted", 0)
    accepted = getattr(stats, "spec_accepted", 0)
    verified = getattr(stats, "spec_verified", 0)
    return [
        ("rillet_spec_draft_tokens", "Speculative decoding: draft tokens verified", "counter", drafted),
        ("rillet_spec_accepted_tokens", "Speculative decoding: draft tokens accepted", "counter", accepted),
        (
            "rillet_spec_verify_steps",
            "Speculative decoding: sequence-steps that verified a draft",
            "counter",
            verified,
        ),
        (
            "rillet_spec_acceptance_rate",
            "Speculative decoding: accepted / drafted tokens since start",
            "gauge",
            accepted / drafted if drafted else 0.0,
        ),
        (
            "rillet_spec_mean_accepted_length",
            "Speculative decoding: tokens a verifying sequence gains per step (accepted drafts + 1)",
            "gauge",
            (accepted + verified) / verified if verified else 0.0,
        ),
    ]
