"""The Model Server Protocol's series (vLLM's names) on /metrics: types, labels, and their values
through a burst, as an endpoint picker (gateway-api-inference-extension, llm-d) parses them."""

from __future__ import annotations

import threading
from collections.abc import Callable

from fake_engine import FakeEngine
from http_helpers import post, request, serving, wait_for
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from rillet.core.engine.stats import EngineStats
from rillet.http.background import BackgroundServer
from rillet.http.metrics.model_server import ServerFacts, model_server_families

MSP = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:lora_requests_info",
    "vllm:cache_config_info",
)


def _scrape(srv: BackgroundServer) -> dict[str, tuple[str, list[Sample]]]:
    text = request(srv, "GET", "/metrics").text
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}


def _value(families: dict[str, tuple[str, list[Sample]]], name: str) -> float:
    (sample,) = families[name][1]
    return sample.value


def test_the_five_series_are_gauges_with_vllms_labels(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake("cache.block_size=16", num_blocks=300)
    with serving(engine) as srv:
        families = _scrape(srv)
        for name in MSP:
            assert families[name][0] == "gauge", name
            assert len(families[name][1]) == 1, name  # one series each
        for name in MSP[:3]:
            (sample,) = families[name][1]
            assert sample.labels == {"model_name": "fake-model", "engine": "0"}
            assert sample.value == 0
        (lora,) = families["vllm:lora_requests_info"][1]
        assert lora.labels == {"running_lora_adapters": "", "waiting_lora_adapters": "", "max_lora": "0"}
        assert lora.value > 1.7e9  # a Unix time
        (cache,) = families["vllm:cache_config_info"][1]
        assert cache.value == 1
        assert cache.labels["block_size"] == "16" and cache.labels["num_gpu_blocks"] == "300"
        assert cache.labels["enable_prefix_caching"] == "True"
        # rillet's own names stay beside them
        assert "rillet_num_requests_running" in families and "rillet_kv_cache_usage_ratio" in families


def test_a_burst_raises_them_and_they_fall_back_to_zero(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake("scheduler.max_num_seqs=2", step_ms=1)
    with serving(engine) as srv:
        body = {"model": "fake-model", "prompt": "x" * 40, "max_tokens": 20}
        threads = [threading.Thread(target=post, args=(srv, "/v1/completions", body)) for _ in range(4)]
        engine.steps_allowed.clear()  # the first admitted are held before their first step
        for t in threads:
            t.start()
        wait_for(lambda: engine.stats().running + engine.stats().waiting == 4, what="the burst in")
        during = _scrape(srv)
        assert _value(during, "vllm:num_requests_running") >= 1
        assert _value(during, "vllm:num_requests_waiting") >= 2  # a batch holds 2 at most
        usage = _value(during, "vllm:kv_cache_usage_perc")
        stats = engine.stats()
        assert usage == stats.kv_blocks_used / stats.kv_blocks_total and 0 < usage <= 1
        engine.steps_allowed.set()
        for t in threads:
            t.join(10)
        after = _scrape(srv)
        for name in MSP[:3]:
            assert _value(after, name) == 0, name


def test_lora_info_names_the_running_and_waiting_adapters() -> None:
    stats = EngineStats(
        3, 2, 10, 100, 0, 0, 0, 0, 0, lora_running=("alpaca", "underdog"), lora_waiting=("alpaca",)
    )
    facts = ServerFacts("base", block_size=16, cache_dtype="auto", prefix_caching=True, max_lora=4)
    families = {f.name: f for f in model_server_families(stats, facts, now=1.8e9)}
    (info,) = families["vllm:lora_requests_info"].samples
    assert info.labels == {
        "running_lora_adapters": "alpaca,underdog",
        "waiting_lora_adapters": "alpaca",
        "max_lora": "4",
    }
    assert info.value == 1.8e9
    (usage,) = families["vllm:kv_cache_usage_perc"].samples
    assert usage.value == 0.1
