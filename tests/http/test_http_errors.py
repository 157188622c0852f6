"""Every error class from raw HTTP: exact status, the OpenAI error shape, and the server serves on."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from fake_engine import BOOM_MARKER, FAIL_MARKER, FakeEngine
from http_helpers import assert_error, post, request, serving, sse_events, wait_for
from rillet.http.background import BackgroundServer

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"


@pytest.fixture(scope="module")
def model(synth_server: BackgroundServer) -> str:
    assert synth_server.state.engine is not None
    return synth_server.state.engine.model_name


def chat(model_name: str, **kw: Any) -> dict[str, Any]:
    return {"model": model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **kw}


def assert_serving(srv: BackgroundServer, model: str) -> None:
    resp = post(srv, CHAT, chat(model))
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"]


def test_malformed_json_and_non_object(synth_server: BackgroundServer, model: str) -> None:
    assert_error(post(synth_server, CHAT, b'{"model": "x", '), 400, code="invalid_json")
    assert_error(post(synth_server, CHAT, b"[1, 2]"), 400, code="invalid_json")
    assert_error(post(synth_server, CHAT, b""), 400, code="invalid_json")
    assert_serving(synth_server, model)


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("temperature", "hot", "temperature"),
        ("temperature", -1, "temperature"),
        ("top_p", 1.5, "top_p"),
        ("top_k", 1.5, "top_k"),
        ("max_tokens", 0, "max_tokens"),
        ("max_tokens", 100000, "max_tokens"),
        ("n", 17, "n"),
        ("n", True, "n"),
        ("stream", "yes", "stream"),
        ("stop", [1, 2], "stop"),
        ("stop", [""], "stop"),
        ("seed", "abc", "seed"),
        ("presence_penalty", 3, "presence_penalty"),
        ("min_tokens", 10, "min_tokens"),
        ("messages", [], "messages"),
        ("messages", [{"role": "wizard", "content": "x"}], "messages[0].role"),
        ("messages", [{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0]"),
        ("model", 5, "model"),
        ("top_logprobs", 2, "top_logprobs"),
        ("stream_options", {"include_usage": True}, "stream_options"),
    ],
)
def test_bad_fields_are_400_naming_the_parameter(
    synth_server: BackgroundServer, model: str, field: str, value: Any, param: str
) -> None:
    assert_error(post(synth_server, CHAT, chat(model, **{field: value})), 400, param=param)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("functions", [{"name": "f"}]),
        ("response_format", {"type": "json_object"}),  # the synthetic model cannot be constrained
    ],
)
def test_unsupported_fields_are_refused(
    synth_server: BackgroundServer, model: str, field: str, value: Any
) -> None:
    assert_error(post(synth_server, CHAT, chat(model, **{field: value})), 400, param=field)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"49152": 1}, "token id 49152, outside the vocabulary (0..49151)"),
        ({"5": 100.5}, "bias of token 5 must be in [-100, 100]"),
        ({"5": -101}, "bias of token 5 must be in [-100, 100]"),
        ({"5": "1"}, "bias of token 5 must be a number"),
        ({"five": 1}, "keys must be token ids"),
        ({"-1": 1}, "keys must be token ids"),
        ([5, 1], "must be an object"),
    ],
)
def test_logit_bias_errors_name_the_field_and_the_token(
    synth_server: BackgroundServer, model: str, value: Any, words: str
) -> None:
    for path, body in ((CHAT, chat(model)), (COMP, {"model": model, "prompt": "hi", "max_tokens": 2})):
        resp = post(synth_server, path, {**body, "logit_bias": value})
        assert_error(resp, 400, param="logit_bias")
        assert words in resp.json()["error"]["message"], resp.text


def test_logit_bias_in_range_is_accepted(synth_server: BackgroundServer, model: str) -> None:
    body = chat(model, logit_bias={"5": -100, "49151": 100, "7": 0.5})
    assert post(synth_server, CHAT, body).status_code == 200


def test_supported_neutral_values_and_unknown_fields_pass(synth_server: BackgroundServer, model: str) -> None:
    body = chat(model, response_format={"type": "text"}, logit_bias={}, tools=None, user="u1", whatever=1)
    assert post(synth_server, CHAT, body).status_code == 200


def test_completions_specific_errors(synth_server: BackgroundServer, model: str) -> None:
    base = {"model": model, "prompt": "hi", "max_tokens": 3}
    assert_error(post(synth_server, COMP, {**base, "suffix": "end"}), 400, param="suffix")
    assert_error(post(synth_server, COMP, {**base, "tools": [{"type": "function"}]}), 400, param="tools")
    assert_error(post(synth_server, COMP, {**base, "best_of": 3}), 400, param="best_of")
    assert_error(post(synth_server, COMP, {**base, "prompt": []}), 400, param="prompt")
    assert_error(post(synth_server, COMP, {**base, "prompt": [1, "a"]}), 400, param="prompt")
    assert_error(post(synth_server, COMP, {**base, "prompt": [10**9]}), 400, param="prompt")
    assert_error(post(synth_server, COMP, {**base, "logprobs": 50}), 400, param="logprobs")
    echoed = {**base, "echo": True, "logprobs": 1, "stream": True}  # the prompt's logprobs: not streamed
    assert_error(post(synth_server, COMP, echoed), 400, param="echo")
    assert_error(post(synth_server, COMP, {"model": model, "max_tokens": 3}), 400, param="prompt")


def test_context_length_exceeded(synth_server: BackgroundServer, model: str) -> None:
    # The synthetic engine of these tests has a 256-token context.
    long_prompt = list(range(1, 300))
    resp = post(synth_server, COMP, {"model": model, "prompt": long_prompt, "max_tokens": 1})
    assert_error(resp, 400, param="prompt", code="context_length_exceeded")
    resp = post(synth_server, COMP, {"model": model, "prompt": [1, 2, 3], "max_tokens": 254})
    assert_error(resp, 400, param="max_tokens", code="context_length_exceeded")
    # No max_tokens: the default shrinks to the room left instead of failing.
    resp = post(synth_server, COMP, {"model": model, "prompt": list(range(1, 250)), "ignore_eos": True})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 7


def test_unknown_model_route_and_method(synth_server: BackgroundServer, model: str) -> None:
    assert_error(post(synth_server, CHAT, chat("gpt-4")), 404, param="model", code="model_not_found")
    assert_error(request(synth_server, "GET", "/v1/nothing"), 404, code="unknown_url")
    wrong = request(synth_server, "GET", CHAT)
    assert_error(wrong, 405, code="method_not_allowed")
    assert wrong.headers["allow"] == "POST"  # HTTP requires a 405 to say what is allowed
    assert_serving(synth_server, model)


def test_body_over_limit_is_413(synthetic_engine: Any) -> None:
    with serving(synthetic_engine, "server.max_body_bytes=2048") as srv:
        big = chat(synthetic_engine.model_name, user="x" * 4000)
        assert_error(post(srv, CHAT, big), 413, code="request_too_large")
        assert_serving(srv, synthetic_engine.model_name)


def test_api_keys(synthetic_engine: Any) -> None:
    with serving(synthetic_engine, "server.api_keys=[k1, k2]") as srv:
        body = chat(synthetic_engine.model_name)
        assert_error(post(srv, CHAT, body), 401, code="invalid_api_key")
        assert_error(post(srv, CHAT, body, {"Authorization": "Bearer nope"}), 401, code="invalid_api_key")
        assert_error(post(srv, CHAT, body, {"Authorization": "Basic k1"}), 401, code="invalid_api_key")
        assert_error(request(srv, "GET", "/v1/models"), 401)
        assert_error(request(srv, "GET", "/metrics"), 401)
        assert request(srv, "GET", "/health").status_code == 200
        assert post(srv, CHAT, body, {"Authorization": "Bearer k2"}).status_code == 200
        assert request(srv, "GET", "/v1/models", headers={"Authorization": "Bearer k1"}).status_code == 200


def test_queue_full_is_429_with_retry_after(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake("scheduler.max_waiting=1", "scheduler.max_num_seqs=1", step_ms=10)
    with serving(engine) as srv:
        hold = {"model": "fake-model", "prompt": "x", "max_tokens": 40}
        threads = [threading.Thread(target=post, args=(srv, COMP, hold)) for _ in range(2)]
        threads[0].start()
        wait_for(lambda: engine.stats().running == 1, what="first request running")
        engine.steps_allowed.clear()  # the first cannot finish (and free the queue) meanwhile
        threads[1].start()
        wait_for(lambda: engine.stats().waiting == 1, what="second request waiting")
        resp = post(srv, COMP, {"model": "fake-model", "prompt": "y", "max_tokens": 1})
        assert_error(resp, 429, code="queue_full")
        assert resp.headers["retry-after"] == "1"
        engine.steps_allowed.set()
        for t in threads:
            t.join(10)
        assert_serving(srv, "fake-model")


def test_starting_and_draining_are_503() -> None:
    from rillet.core.config import load_config

    with serving(None, cfg=load_config()) as srv:
        assert_error(post(srv, CHAT, chat("m")), 503, code="starting")
        health = request(srv, "GET", "/health")
        assert health.status_code == 503 and health.json()["status"] == "starting"


def test_draining_refuses_new_work(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake()
    with serving(engine) as srv:
        srv.state.phase = "draining"
        assert_error(post(srv, CHAT, chat("fake-model")), 503, code="draining")
        assert request(srv, "GET", "/health").status_code == 503


def test_unexpected_exception_is_500_json(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake()
    with serving(engine) as srv:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": BOOM_MARKER}]}
        assert_error(post(srv, CHAT, body), 500, code="internal_error")
        assert_serving(srv, "fake-model")


def test_error_after_stream_began_is_an_sse_event(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake()
    with serving(engine) as srv:
        body = {"model": "fake-model", "prompt": FAIL_MARKER, "max_tokens": 50, "stream": True}
        resp = post(srv, COMP, body)
        assert resp.status_code == 200
        events = sse_events(resp.content)
        assert events[-1] == "[DONE]"
        assert set(events[-2]) == {"error"} and events[-2]["error"]["code"] == "generation_error"
        assert any(e["choices"][0]["text"] for e in events[:-2])  # some text came before the error
        # The same failure without streaming is a plain 500.
        assert_error(post(srv, COMP, {**body, "stream": False}), 500, code="generation_error")
        assert_serving(srv, "fake-model")


def test_engine_death_is_503_and_fails_open_streams(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake(step_ms=5)
    with serving(engine) as srv:
        result: dict[str, Any] = {}
        body = {"model": "fake-model", "prompt": "x", "max_tokens": 500, "stream": True}
        t = threading.Thread(target=lambda: result.update(r=post(srv, COMP, body)))
        t.start()
        wait_for(lambda: engine.stats().running == 1, what="stream running")
        engine.crash_next_step = True
        t.join(10)
        events = sse_events(result["r"].content)
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "dead"
        wait_for(lambda: srv.state.phase == "dead", what="dead phase")
        assert_error(post(srv, CHAT, chat("fake-model")), 503, code="dead")
        health = request(srv, "GET", "/health")
        assert health.status_code == 503 and "injected" in health.json()["error"]
