"""rillet serves, at /metrics, every series the endpoint picker's config reads
(deploy_kit/model_server_protocol.py), with the types and labels the Model Server Protocol
gives them: a server over the synthetic engine, scraped once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from deploy_kit.model_server_protocol import MODEL_SERVER_PROTOCOL
from http_helpers import SYNTH_OVERRIDES, request, serving
from prometheus_client.parser import text_string_to_metric_families
from rillet.core.config import load_config
from rillet.http.background import BackgroundServer


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    from rillet.core.engine.engine import Engine

    engine = Engine(load_config(None, SYNTH_OVERRIDES))
    engine.start()
    try:
        with serving(engine) as srv:
            yield srv
    finally:
        engine.shutdown()


def _families(srv: BackgroundServer) -> dict[str, Any]:
    resp = request(srv, "GET", "/metrics")
    assert resp.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(resp.text)}


def test_rillet_serves_what_the_picker_reads(server: BackgroundServer) -> None:
    families = _families(server)
    lora = MODEL_SERVER_PROTOCOL["loraSpec"]
    for name in (n for n in MODEL_SERVER_PROTOCOL.values() if n != lora):
        assert name in families, f"{name} missing from /metrics"
        assert families[name].type == "gauge", name
    waiting = families[MODEL_SERVER_PROTOCOL["queuedRequestsSpec"]].samples
    running = families[MODEL_SERVER_PROTOCOL["runningRequestsSpec"]].samples
    assert [s.value for s in waiting] == [0] and [s.value for s in running] == [0]  # idle
    (usage,) = families[MODEL_SERVER_PROTOCOL["kvUsageSpec"]].samples
    assert 0 <= usage.value <= 1  # a fraction, as vLLM's, despite the name
    (info,) = families[MODEL_SERVER_PROTOCOL["cacheInfoSpec"]].samples
    engine = server.state.engine
    assert engine is not None
    assert int(info.labels["block_size"]) == engine.cfg.cache.block_size
    assert int(info.labels["num_gpu_blocks"]) == engine.stats().kv_blocks_total
    # vLLM emits its LoRA series only with adapters (the picker reads none as "no adapters")
    for sample in families[lora].samples if lora in families else []:
        assert {"max_lora", "running_lora_adapters", "waiting_lora_adapters"} <= set(sample.labels)
