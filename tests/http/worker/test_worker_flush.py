"""POST /flush_cache over a real engine (the synthetic model: the real scheduler, block pool and
prefix cache, no model compute): what it forgets, what it keeps while a request runs, and the
Model Server Protocol's gauges around it."""

from __future__ import annotations

import re
import threading
from typing import Any

from engine_hooks import hold_steps
from http_helpers import Resp, post, request, wait_for
from rillet.http.background import BackgroundServer

COMP = "/v1/completions"


def _gauge(srv: BackgroundServer, name: str) -> float:
    text = request(srv, "GET", "/metrics").text
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} missing"
    return float(m.group(1))


def _usage(srv: BackgroundServer, prompt: str) -> dict[str, Any]:
    body = {"model": srv.state.engine.model_name, "prompt": prompt, "max_tokens": 2}  # type: ignore[union-attr]
    usage: dict[str, Any] = post(srv, COMP, body).json()["usage"]
    return usage


def _cached(srv: BackgroundServer, prompt: str) -> int:
    return int(_usage(srv, prompt)["prompt_tokens_details"]["cached_tokens"])


def test_flush_forgets_free_blocks_and_keeps_a_running_requests(synth_server: BackgroundServer) -> None:
    engine: Any = synth_server.state.engine
    name, block = engine.model_name, engine.cfg.cache.block_size
    done_prompt = " ".join(f"alpha{i}" for i in range(50))  # served before the flush: blocks free
    run_prompt = " ".join(f"beta{i}" for i in range(50))  # running across the flush: blocks held
    done_blocks = _usage(synth_server, done_prompt)["prompt_tokens"] // block
    assert _cached(synth_server, done_prompt) > 0  # in the cache before the flush
    flush_queued = threading.Event()
    replies: dict[str, Resp] = {}

    def send(key: str, path: str, body: Any) -> None:
        replies[key] = post(synth_server, path, body)

    running = {"model": name, "prompt": run_prompt, "max_tokens": 40}
    # park the engine in a decode step of the running request (its prompt's blocks registered)
    decoding = lambda batch: any(s.num_computed >= s.prompt_len + 3 for s in batch.seqs)  # noqa: E731
    with hold_steps(engine, until=lambda batch: flush_queued.is_set(), when=decoding) as holding:
        gen = threading.Thread(target=send, args=("gen", COMP, running))
        gen.start()
        assert holding.wait(30)
        assert _gauge(synth_server, "vllm:num_requests_running") == 1
        assert _gauge(synth_server, "vllm:kv_cache_usage_perc") > 0
        flush = threading.Thread(target=send, args=("flush", "/flush_cache", None))
        flush.start()
        wait_for(lambda: bool(engine._inbox), what="the flush queued for the engine thread")
        flush_queued.set()  # the flush runs between this step and the next: the request still runs
        flush.join(30)
        gen.join(30)
    done = replies["flush"].json()
    prompt_blocks = replies["gen"].json()["usage"]["prompt_tokens"] // block
    assert done["kept_blocks"] >= prompt_blocks > 0 and done["flushed_blocks"] >= done_blocks > 0
    assert replies["gen"].json()["usage"]["completion_tokens"] == 40  # untouched by the flush
    wait_for(lambda: engine.stats().kv_blocks_used == 0, what="the blocks released")
    engine.core.blocks.check_integrity()
    assert _gauge(synth_server, "vllm:num_requests_running") == 0
    assert _gauge(synth_server, "vllm:kv_cache_usage_perc") == 0
    assert _cached(synth_server, done_prompt) == 0  # forgotten
    assert _cached(synth_server, run_prompt) > 0  # kept: its blocks were held during the flush


def test_an_idle_flush_empties_the_cache(synth_server: BackgroundServer) -> None:
    engine: Any = synth_server.state.engine
    prompt = " ".join(f"gamma{i}" for i in range(50))
    _cached(synth_server, prompt)
    assert engine.stats().cached_blocks > 0
    done = post(synth_server, "/flush_cache", None).json()
    assert done["kept_blocks"] == 0 and done["flushed_blocks"] > 0
    assert engine.stats().cached_blocks == 0
    assert _cached(synth_server, prompt) == 0
    engine.core.blocks.check_integrity()
