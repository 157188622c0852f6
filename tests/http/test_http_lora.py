"""LoRA adapters through the server (a tiny random Llama, adapters made by peft): `model` picks an
adapter on completions, chat, Responses and Messages; /v1/models lists adapters with their parent;
vLLM's load / unload routes behind the API key, with OpenAI-shaped 400 / 404 errors; loading,
using, unloading and reloading while a load generator runs other adapters' requests gives those no
error and leaves the KV pool whole; an adapter unloaded mid-request lets the request finish."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from http_helpers import assert_error, post, request, serving, wait_for
from rillet.core.config import load_config
from rillet.http.background import BackgroundServer
from tiny_models.lora_adapters import PROMPTS

KEY = "sk-lora"
AUTH = {"Authorization": f"Bearer {KEY}"}
NEW = 8


@pytest.fixture(scope="module")
def engine(lora_setup: dict[str, Any]) -> Iterator[Any]:
    from rillet.core.engine.engine import Engine

    overrides = [
        f"model.path={lora_setup['folder']}",
        "model.kind=hf",
        "model.dtype=float32",
        "scheduler.max_num_seqs=8",
        f"lora.adapters={{a1: {lora_setup['paths']['a1']}}}",
        "lora.max_loras=2",  # three adapters in use at times: LRU swapping while serving
        "lora.allow_runtime_updates=true",
        f"server.api_keys=[{KEY}]",
    ]
    eng = Engine(load_config(None, overrides))
    eng.start()
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[BackgroundServer]:
    with serving(engine, cfg=engine.cfg) as srv:  # the engine's config: API key, LoRA routes
        yield srv


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)


def _complete(client: openai.OpenAI, model: str, prompt: list[int] = PROMPTS[3], n: int = NEW) -> Any:
    return client.completions.create(
        model=model, prompt=prompt, max_tokens=n, temperature=0, extra_body={"ignore_eos": True}
    )


def _idle(engine: Any) -> bool:
    s = engine.stats()
    return s.running == 0 and s.waiting == 0 and s.kv_blocks_used == 0


def test_models_lists_adapters_with_their_parent(server: BackgroundServer, engine: Any) -> None:
    cards = request(server, "GET", "/v1/models", headers=AUTH).json()["data"]
    assert [c["id"] for c in cards] == [engine.model_name, "a1"]
    assert cards[1]["parent"] == engine.model_name and "parent" not in cards[0]
    one = request(server, "GET", "/v1/models/a1", headers=AUTH)
    assert one.status_code == 200 and one.json()["parent"] == engine.model_name


def test_model_selects_the_adapter_on_every_endpoint(
    client: openai.OpenAI, server: BackgroundServer, engine: Any
) -> None:
    base, lora = _complete(client, engine.model_name), _complete(client, "a1")
    assert lora.model == "a1" and base.model == engine.model_name
    assert lora.choices[0].text != base.choices[0].text  # the adapter changes the answer
    assert _complete(client, "a1").choices[0].text == lora.choices[0].text


def test_every_chat_front_end_carries_the_adapter(engine: Any) -> None:
    """chat, Responses and Messages requests name the adapter to the engine (their prompts go
    through the default tokenizer's chat template: ids past the tiny model's vocabulary, so the
    parsed request is checked here, and completions above run the adapter end to end)."""
    from rillet.http.anthropic.protocol import parse_messages
    from rillet.http.openai.protocol import Limits, parse_chat
    from rillet.http.responses.protocol import parse_responses

    limits = Limits(engine.model_name, 256, 64, 16, 1, adapters=engine.lora)
    msgs = [{"role": "user", "content": "hi"}]
    tok = engine.tokenizer
    for model, lora in ((engine.model_name, None), ("a1", "a1")):
        assert parse_chat({"model": model, "messages": msgs}, tok, limits).lora == lora
        assert parse_responses({"model": model, "input": "hi"}, tok, limits).gen.lora == lora
        assert parse_messages({"model": model, "messages": msgs, "max_tokens": 4}, tok, limits).lora == lora
    with pytest.raises(Exception, match="does not exist"):
        parse_chat({"model": "a9", "messages": msgs}, tok, limits)


def test_unknown_model_is_404(server: BackgroundServer) -> None:
    r = post(server, "/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 2}, AUTH)
    assert_error(r, 404, param="model", code="model_not_found")


def test_load_needs_the_api_key(server: BackgroundServer, lora_setup: dict[str, Any]) -> None:
    r = post(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": lora_setup["paths"]["a2"]})
    assert r.status_code == 401


def test_load_use_unload_reload(
    client: openai.OpenAI, server: BackgroundServer, engine: Any, lora_setup: dict[str, Any]
) -> None:
    path = lora_setup["paths"]["a2"]
    r = post(server, "/v1/load_lora_adapter", {"lora_name": "a2", "lora_path": path}, AUTH)
    assert r.status_code == 200, r.text
    assert_error(
        post(server, "/v1/load_lora_adapter", {"lora_name": "a2", "lora_path": path}, AUTH),
        400,
        code="lora_adapter_exists",
    )
    first = _complete(client, "a2").choices[0].text
    assert 'adapter="a2"' in request(server, "GET", "/metrics", headers=AUTH).text
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "a2"}, AUTH).status_code == 200
    # an unloaded adapter's series leave /metrics (once its request has finished)
    wait_for(lambda: 'adapter="a2"' not in request(server, "GET", "/metrics", headers=AUTH).text)
    assert_error(
        post(server, "/v1/completions", {"model": "a2", "prompt": "x", "max_tokens": 2}, AUTH),
        404,
        param="model",
    )
    assert_error(
        post(server, "/v1/unload_lora_adapter", {"lora_name": "a2"}, AUTH), 404, code="lora_adapter_not_found"
    )
    assert (
        post(server, "/v1/load_lora_adapter", {"lora_name": "a2", "lora_path": path}, AUTH).status_code == 200
    )
    assert _complete(client, "a2").choices[0].text == first  # the same weights again
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "a2"}, AUTH).status_code == 200
    wait_for(lambda: _idle(engine), what="idle engine")


def test_an_org_slash_name_is_an_adapter_name(
    client: openai.OpenAI, server: BackgroundServer, engine: Any, lora_setup: dict[str, Any]
) -> None:
    """vLLM users name adapters as the hub does (`org/name`): loaded, served as `model`, and
    retrieved from /v1/models/{id} (the SDK's models.retrieve), slash and all."""
    path = lora_setup["paths"]["a1"]  # a1's weights under a second name
    r = post(server, "/v1/load_lora_adapter", {"lora_name": "acme/sql-v2", "lora_path": path}, AUTH)
    assert r.status_code == 200, r.text
    assert _complete(client, "acme/sql-v2").choices[0].text == _complete(client, "a1").choices[0].text
    card = client.models.retrieve("acme/sql-v2")
    assert card.id == "acme/sql-v2" and card.model_dump()["parent"] == engine.model_name
    assert_error(request(server, "GET", "/v1/models/acme/none", headers=AUTH), 404, param="model")
    for bad in ("/acme", "acme/", "acme//sql", "acme/../sql"):
        r = post(server, "/v1/load_lora_adapter", {"lora_name": bad, "lora_path": path}, AUTH)
        assert_error(r, 400)
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "acme/sql-v2"}, AUTH).status_code == 200
    wait_for(lambda: _idle(engine), what="idle engine")


def test_bad_adapter_is_a_400_and_the_server_keeps_serving(
    client: openai.OpenAI, server: BackgroundServer, engine: Any, lora_setup: dict[str, Any], tmp_path: Path
) -> None:
    bad = tmp_path / "truncated"
    shutil.copytree(lora_setup["paths"]["a3"], bad)
    weights = bad / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    r = post(server, "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": str(bad)}, AUTH)
    assert_error(r, 400, code="invalid_lora_adapter")
    assert "adapter_model.safetensors" in r.json()["error"]["message"]
    r = post(server, "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": str(tmp_path / "none")}, AUTH)
    assert_error(r, 400, code="invalid_lora_adapter")
    assert_error(post(server, "/v1/load_lora_adapter", {"lora_name": "bad"}, AUTH), 400, param="lora_path")
    assert "bad" not in [c["id"] for c in request(server, "GET", "/v1/models", headers=AUTH).json()["data"]]
    assert _complete(client, "a1").choices[0].text  # still serving


def test_churn_while_a_load_generator_runs(
    client: openai.OpenAI, server: BackgroundServer, engine: Any, lora_setup: dict[str, Any]
) -> None:
    """Other adapters' requests run throughout; a3 is loaded, used, unloaded and reloaded under
    them (two slots for a1, a3 and the requests' own: swapping happens)."""
    want = {name: _complete(client, name).choices[0].text for name in ("a1", engine.model_name)}
    errors: list[str] = []
    stop = threading.Event()

    def generate(name: str) -> None:
        while not stop.is_set():
            try:
                text = _complete(client, name).choices[0].text
                if text != want[name]:
                    errors.append(f"{name}: {text!r} != {want[name]!r}")
            except Exception as exc:  # any error fails the test below
                errors.append(f"{name}: {exc!r}")

    threads = [threading.Thread(target=generate, args=(n,)) for n in ("a1", "a1", engine.model_name)]
    for t in threads:
        t.start()
    try:
        path = lora_setup["paths"]["a3"]
        texts = []
        for _ in range(2):
            assert (
                post(
                    server, "/v1/load_lora_adapter", {"lora_name": "a3", "lora_path": path}, AUTH
                ).status_code
                == 200
            )
            texts.append(_complete(client, "a3").choices[0].text)
            assert post(server, "/v1/unload_lora_adapter", {"lora_name": "a3"}, AUTH).status_code == 200
        assert texts[0] == texts[1]
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    wait_for(lambda: _idle(engine), what="idle engine")
    engine.core.blocks.check_integrity()
    slots = engine.core.scheduler.lora_slots
    assert slots.busy() == 0 and slots.loads > slots.num_slots


def test_unloading_lets_requests_in_flight_finish(
    client: openai.OpenAI, server: BackgroundServer, engine: Any, lora_setup: dict[str, Any]
) -> None:
    path = lora_setup["paths"]["a2"]
    assert (
        post(server, "/v1/load_lora_adapter", {"lora_name": "a2", "lora_path": path}, AUTH).status_code == 200
    )
    done = _completions_200(server)
    stream = client.completions.create(
        model="a2",
        prompt=PROMPTS[1],
        max_tokens=64,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    first = next(chunks)  # running now
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "a2"}, AUTH).status_code == 200
    rest = list(chunks)
    assert first.model == "a2" and rest[-1].choices[0].finish_reason == "length"
    assert_error(post(server, "/v1/completions", {"model": "a2", "prompt": "x", "max_tokens": 2}, AUTH), 404)
    wait_for(lambda: _idle(engine), what="idle engine")
    engine.core.blocks.check_integrity()
    # its handler has ended (counted): its generated tokens did not bring a2's series back
    wait_for(lambda: _completions_200(server) > done, what="the stream's handler to end")
    assert 'adapter="a2"' not in request(server, "GET", "/metrics", headers=AUTH).text


def _completions_200(server: BackgroundServer) -> float:
    text = request(server, "GET", "/metrics", headers=AUTH).text
    line = 'rillet_requests_total{endpoint="/v1/completions",status="200"} '
    return sum(float(x.removeprefix(line)) for x in text.splitlines() if x.startswith(line))


def test_metrics_per_adapter(client: openai.OpenAI, server: BackgroundServer) -> None:
    _complete(client, "a1")
    text = request(server, "GET", "/metrics", headers=AUTH).text
    assert 'rillet_lora_requests_total{adapter="a1"}' in text
    assert 'rillet_lora_tokens_total{adapter="a1",kind="generation"}' in text


def test_routes_absent_without_runtime_updates() -> None:
    with serving(None, "lora.allow_runtime_updates=false") as srv:
        r = post(srv, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/x"})
        assert r.status_code == 404


def test_lora_requests_info_names_the_running_adapter(server: BackgroundServer, engine: Any) -> None:
    """vllm:lora_requests_info (the Model Server Protocol's LoRA series) while an adapter's request
    runs, and after."""
    from engine_hooks import hold_steps
    from prometheus_client.parser import text_string_to_metric_families

    def lora_labels() -> dict[str, str]:
        text = request(server, "GET", "/metrics", headers=AUTH).text
        (family,) = (f for f in text_string_to_metric_families(text) if f.name == "vllm:lora_requests_info")
        (sample,) = family.samples
        return sample.labels

    release = threading.Event()
    body = {"model": "a1", "prompt": PROMPTS[3], "max_tokens": 4}
    uses_lora = lambda batch: any(s.lora is not None for s in batch.seqs)  # noqa: E731
    with hold_steps(engine, until=lambda batch: release.is_set(), when=uses_lora) as holding:
        t = threading.Thread(target=post, args=(server, "/v1/completions", body, AUTH))
        t.start()
        assert holding.wait(60)
        during = lora_labels()
        release.set()
        t.join(60)
    assert during == {"running_lora_adapters": "a1", "waiting_lora_adapters": "", "max_lora": "2"}
    wait_for(lambda: _idle(engine))
    assert lora_labels()["running_lora_adapters"] == ""
