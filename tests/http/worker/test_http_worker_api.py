"""The routers' worker API over the fake engine: the shapes sglang-router / smg (0.3.2) and
vllm-router parse (docs/worker-api.md), the bodies they send, and the API key rule."""

from __future__ import annotations

import threading
from collections.abc import Callable

from fake_engine import FakeEngine
from http_helpers import assert_error, post, request, serving, wait_for

COMP = "/v1/completions"
INFO_ROUTES = ("/server_info", "/get_server_info", "/model_info", "/get_model_info", "/get_load")

# What sglang-router 0.3.2 (smg) sent a worker for `{"model", "messages"|"prompt", "max_tokens": 3}`
# (captured from the real router in front of a recording server): its typed request re-serialised
# with its own fields at their defaults.
ROUTED_CHAT = {
    "messages": [{"role": "user", "content": "hi"}],
    "model": "fake-model",
    "logprobs": False,
    "max_completion_tokens": 3,
    "stream": False,
    "no_stop_trim": False,
    "ignore_eos": False,
    "continue_final_message": False,
    "skip_special_tokens": True,
    "separate_reasoning": True,
    "stream_reasoning": True,
    "return_hidden_states": False,
}
ROUTED_COMPLETION = {
    "model": "fake-model",
    "prompt": "hi",
    "max_tokens": 3,
    "stream": False,
    "echo": False,
    "no_stop_trim": False,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "return_hidden_states": False,
}
# What routers add in their other modes: SGLang's request id, PD disaggregation's bootstrap
# fields, the DP-aware rank, SGLang's LoRA path (unset)
ROUTER_EXTRAS = {
    "rid": "req-1upzSuvfPiMoN1u551EnrQy8",
    "bootstrap_host": "10.0.0.1",
    "bootstrap_port": 8998,
    "bootstrap_room": 123456789,
    "data_parallel_rank": 0,
    "lora_path": None,
}


def test_server_info_has_what_the_routers_parse(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake("scheduler.max_num_seqs=8", "cache.block_size=16", num_blocks=512)
    with serving(engine) as srv:
        info = request(srv, "GET", "/server_info").json()
        assert request(srv, "GET", "/get_server_info").json() == info
        assert info["served_model_name"] == "fake-model"  # smg's model id
        assert info["model_path"] == "/models/fake-model.gguf"
        assert info["max_total_tokens"] == 512 * 16
        assert info["max_running_requests"] == 8
        assert info["dp_size"] == 1 and info["context_length"] == engine.max_model_len
        assert isinstance(info["version"], str) and info["version"]
        # smg parses model_id with `model` as its alias: both keys at once fail its parse
        assert "model_id" not in info and "model" not in info


def test_model_info(make_fake: Callable[..., FakeEngine]) -> None:
    with serving(make_fake()) as srv:
        info = request(srv, "GET", "/model_info").json()
        assert request(srv, "GET", "/get_model_info").json() == info
        assert info["model_path"] == "/models/fake-model.gguf"
        assert info["is_generation"] is True
        assert info["model_type"] == "llama" and info["architectures"] == ["LlamaForCausalLM"]


def test_models_list_the_context_length_and_owner(make_fake: Callable[..., FakeEngine]) -> None:
    with serving(make_fake()) as srv:
        (card,) = request(srv, "GET", "/v1/models").json()["data"]
        assert card["id"] == "fake-model" and card["owned_by"] == "rillet"
        assert card["max_model_len"] == 1024 and "parent" not in card


def test_get_load_counts_requests_and_kv_tokens(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake("scheduler.max_num_seqs=2", "cache.block_size=16", step_ms=1)
    with serving(engine) as srv:
        assert request(srv, "GET", "/get_load").json() == [
            {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
        ]
        body = {"model": "fake-model", "prompt": "x" * 20, "max_tokens": 30}
        threads = [threading.Thread(target=post, args=(srv, COMP, body)) for _ in range(3)]
        engine.steps_allowed.clear()  # the first admitted are held before their first step
        for t in threads:
            t.start()
        wait_for(lambda: engine.stats().running + engine.stats().waiting == 3, what="three requests in")
        (load,) = request(srv, "GET", "/get_load").json()
        stats = engine.stats()
        assert load["num_reqs"] == 3 and load["num_waiting_reqs"] == stats.waiting >= 1  # a batch of 2
        assert load["num_tokens"] == stats.kv_blocks_used * 16 > 0
        engine.steps_allowed.set()
        for t in threads:
            t.join(10)
        assert request(srv, "GET", "/get_load").json()[0]["num_reqs"] == 0


def test_flush_cache_answers_both_methods(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake()
    with serving(engine) as srv:
        resp = request(srv, "POST", "/flush_cache")  # the routers send no body
        assert resp.status_code == 200
        assert resp.json() == {"message": "Cache flushed.", "flushed_blocks": 0, "kept_blocks": 0}
        assert request(srv, "GET", "/flush_cache").status_code == 200
        assert post(srv, "/flush_cache", b"{not json").status_code == 200  # a body is ignored
        assert engine.flushes == 3


def test_routed_bodies_are_served(make_fake: Callable[..., FakeEngine]) -> None:
    with serving(make_fake()) as srv:
        for path, body in (("/v1/chat/completions", ROUTED_CHAT), (COMP, ROUTED_COMPLETION)):
            for sent in (body, {**body, **ROUTER_EXTRAS}):
                resp = post(srv, path, sent)
                assert resp.status_code == 200, resp.text
                assert resp.json()["usage"]["completion_tokens"] == 3


def test_worker_routes_follow_the_api_key_rule(make_fake: Callable[..., FakeEngine]) -> None:
    with serving(make_fake(), "server.api_keys=[k1]") as srv:
        key = {"Authorization": "Bearer k1"}
        for path in INFO_ROUTES:
            assert_error(request(srv, "GET", path), 401, code="invalid_api_key")
            assert request(srv, "GET", path, headers=key).status_code == 200
        assert_error(post(srv, "/flush_cache", None), 401, code="invalid_api_key")
        assert post(srv, "/flush_cache", None, key).status_code == 200


def test_a_dead_engine_is_503(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake()
    with serving(engine) as srv:
        engine.crash_next_step = True
        post(srv, COMP, {"model": "fake-model", "prompt": "x", "max_tokens": 2})
        wait_for(lambda: srv.state.phase == "dead", what="the engine's death noticed")
        for path in INFO_ROUTES:
            assert_error(request(srv, "GET", path), 503)
        assert_error(post(srv, "/flush_cache", None), 503)
