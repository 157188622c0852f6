"""/health and /metrics (Prometheus text from the app's own registry)."""

from __future__ import annotations

import re

from http_helpers import post, request
from rillet.core.engine.stats import EngineStats
from rillet.http.background import BackgroundServer
from rillet.http.metrics.registry import engine_samples


def _value(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} missing"
    return float(m.group(1))


def test_health_and_metrics(synth_server: BackgroundServer) -> None:
    health = request(synth_server, "GET", "/health")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    engine = synth_server.state.engine
    assert engine is not None
    body = {"model": engine.model_name, "prompt": "count me", "max_tokens": 5, "stream": True}
    for _ in range(3):
        assert post(synth_server, "/v1/completions", body).status_code == 200
    assert post(synth_server, "/v1/completions", {**body, "model": "nope"}).status_code == 404

    resp = request(synth_server, "GET", "/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    assert _value(text, 'rillet_requests_total{endpoint="/v1/completions",status="200"}') == 3
    assert _value(text, 'rillet_requests_total{endpoint="/v1/completions",status="404"}') == 1
    assert _value(text, "rillet_generation_tokens_total") == 15
    assert _value(text, "rillet_prompt_tokens_total") > 0
    assert _value(text, "rillet_time_to_first_token_seconds_count") == 3
    assert _value(text, "rillet_inter_token_latency_seconds_count") == 12
    assert _value(text, "rillet_kv_blocks_total") == engine.stats().kv_blocks_total
    stats = engine.stats()
    assert _value(text, "rillet_kv_cache_tokens_total") == stats.kv_blocks_total * engine.cfg.cache.block_size
    assert _value(text, "rillet_deterministic") == 0  # the synthetic model computes nothing to make invariant
    for name in (
        "rillet_kv_blocks_used",
        "rillet_num_requests_running",
        "rillet_num_requests_waiting",
        "rillet_prefix_cache_hit_rate",
        "rillet_prefix_cache_blocks",
        "rillet_engine_steps_total",
        "rillet_num_preemptions_total",
        "rillet_ring_wakeups_total",
        "rillet_handoff_timeouts_total",
    ):
        _value(text, name)


def test_prefix_cache_counters_give_a_hit_rate_over_any_window(synth_server: BackgroundServer) -> None:
    engine = synth_server.state.engine
    assert engine is not None

    def counters() -> tuple[float, float]:
        text = request(synth_server, "GET", "/metrics").text
        queries = _value(text, "rillet_prefix_cache_queries_total")
        return queries, _value(text, "rillet_prefix_cache_hits_total")

    prompt = " ".join(f"word{i}" for i in range(40))  # several KV blocks
    body = {"model": engine.model_name, "prompt": prompt, "max_tokens": 2}
    q0, h0 = counters()
    first = post(synth_server, "/v1/completions", body).json()["usage"]
    q1, h1 = counters()
    second = post(synth_server, "/v1/completions", body).json()["usage"]
    q2, h2 = counters()
    assert q1 - q0 == first["prompt_tokens"] and q2 - q1 == second["prompt_tokens"]
    assert h1 - h0 == first["prompt_tokens_details"]["cached_tokens"]
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and h2 - h1 == cached  # the repeated prompt's full blocks came from the cache


def test_deterministic_mode_is_a_gauge_of_one() -> None:
    stats = EngineStats(0, 0, 0, 8, 0, 0, 0, 0, 0, deterministic=True)
    values = {name: value for name, _, _, value in engine_samples(stats, 0, 0)}
    assert values["rillet_deterministic"] == 1
