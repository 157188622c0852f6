"""The Model Server Protocol's series (Kubernetes' Gateway API Inference Extension, llm-d): the
five series an endpoint picker reads, under vLLM's names and with vLLM's semantics, beside rillet's
own (registry.py), so a picker needs no flags. Computed from one `engine.stats()` at scrape time.

  vllm:num_requests_running   gauge, sequences in the running batch     (rillet_num_requests_running)
  vllm:num_requests_waiting   gauge, sequences queued for admission     (rillet_num_requests_waiting)
  vllm:kv_cache_usage_perc    gauge, KV blocks in use / blocks, 0 to 1  (rillet_kv_cache_usage_ratio)
  vllm:lora_requests_info     gauge whose value is a Unix time; labels running_lora_adapters,
                              waiting_lora_adapters (comma-separated names), max_lora
  vllm:cache_config_info      gauge of 1; labels block_size, num_gpu_blocks (the pool's blocks,
                              also on CPU), cache_dtype, enable_prefix_caching
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass(frozen=True)
class ServerFacts:
    """What the series need besides the engine's counters (fixed once the engine is attached)."""

    model_name: str
    block_size: int
    cache_dtype: str
    prefix_caching: bool
    max_lora: int  # lora.max_loras; 0 when the server serves no adapters


def model_server_families(stats: Any, facts: ServerFacts, now: float) -> list[Metric]:
    """`stats`: an EngineStats (core/engine/stats.py) or a test double's."""
    labels = {"model_name": facts.model_name, "engine": "0"}  # vLLM's labels (engine: its DP rank)
    usage = stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0
    out: list[Metric] = []
    for name, doc, value in (
        ("vllm:num_requests_running", "Number of requests in model execution batches.", stats.running),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", stats.waiting),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage),
    ):
        family = GaugeMetricFamily(name, doc, labels=list(labels))
        family.add_metric(list(labels.values()), float(value))
        out.append(family)
    lora = {
        "running_lora_adapters": ",".join(getattr(stats, "lora_running", ())),
        "waiting_lora_adapters": ",".join(getattr(stats, "lora_waiting", ())),
        "max_lora": str(facts.max_lora),
    }
    # one series, of the current adapters: a picker takes the series of the latest time
    info = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.", labels=list(lora))
    info.add_metric(list(lora.values()), now)
    out.append(info)
    cache = {
        "block_size": str(facts.block_size),
        "num_gpu_blocks": str(stats.kv_blocks_total),
        "cache_dtype": facts.cache_dtype,
        "enable_prefix_caching": str(facts.prefix_caching),  # Python's spelling, as vLLM's
    }
    config = GaugeMetricFamily(
        "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(cache)
    )
    config.add_metric(list(cache.values()), 1.0)
    out.append(config)
    return out


class ModelServerSeries(Collector):
    def __init__(self, families: Callable[[], list[Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families()
