"""The request field `priority` on every generation API (chat, completions, Responses, Anthropic
Messages), through the HTTP layer on the fake engine: an integer reaches the engine's request
(scheduler.policy priority); a boolean, float or string is a 400 naming the field, in the API's own
error shape; under fcfs any value but 0 is a 400, as vLLM answers. The real SDKs send it as their
documented extension (`extra_body`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest
from fake_engine import FakeEngine
from http_helpers import assert_error, post, serving
from rillet.core.config import load_config
from rillet.http.background import BackgroundServer

MODEL = "fake-model"
USER = [{"role": "user", "content": "hi"}]
BODIES: dict[str, Callable[[], dict[str, Any]]] = {
    "/v1/chat/completions": lambda: {"model": MODEL, "messages": USER, "max_tokens": 2},
    "/v1/completions": lambda: {"model": MODEL, "prompt": "hi", "max_tokens": 2},
    "/v1/responses": lambda: {"model": MODEL, "input": "hi", "max_output_tokens": 2},
    "/v1/messages": lambda: {"model": MODEL, "messages": USER, "max_tokens": 2},
}
ROUTES = list(BODIES)


def _serve(*overrides: str) -> Iterator[tuple[BackgroundServer, FakeEngine]]:
    engine = FakeEngine(load_config(None, list(overrides)))
    engine.start()
    try:
        with serving(engine, *overrides) as srv:
            yield srv, engine
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def prio() -> Iterator[tuple[BackgroundServer, FakeEngine]]:
    yield from _serve("scheduler.policy=priority")


@pytest.fixture(scope="module")
def fcfs() -> Iterator[tuple[BackgroundServer, FakeEngine]]:
    yield from _serve()


def assert_400_naming_priority(resp: Any, route: str, code: str) -> None:
    if route == "/v1/messages":  # Anthropic's shape: the field is named in the message
        assert resp.status_code == 400, resp.text
        err = resp.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
        assert "'priority'" in err["error"]["message"], err
    else:
        assert_error(resp, 400, param="priority", code=code)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("value", [-3, 0, 7, None])
def test_an_integer_priority_reaches_the_engine(prio: Any, route: str, value: int | None) -> None:
    srv, engine = prio
    resp = post(srv, route, {**BODIES[route](), "priority": value})
    assert resp.status_code == 200, resp.text
    assert engine.priorities[-1] == (value or 0)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("value", [True, 1.5, 2.0, "1", [1], {"level": 1}])
def test_a_priority_that_is_not_an_integer_is_a_400_naming_it(prio: Any, route: str, value: Any) -> None:
    srv, engine = prio
    before = len(engine.priorities)
    assert_400_naming_priority(
        post(srv, route, {**BODIES[route](), "priority": value}), route, "invalid_type"
    )
    assert len(engine.priorities) == before  # nothing reached the engine


@pytest.mark.parametrize("route", ROUTES)
def test_fcfs_takes_priority_0_and_refuses_any_other(fcfs: Any, route: str) -> None:
    srv, engine = fcfs
    assert post(srv, route, {**BODIES[route](), "priority": 0}).status_code == 200
    assert engine.priorities[-1] == 0
    for value in (1, -1):
        assert_400_naming_priority(
            post(srv, route, {**BODIES[route](), "priority": value}), route, "invalid_value"
        )
    assert post(srv, route, BODIES[route]()).status_code == 200  # and serves on


def test_the_sdks_send_it_as_an_extension(prio: Any) -> None:
    srv, engine = prio
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, extra_body={"priority": -2})  # type: ignore[arg-type]
    assert engine.priorities[-1] == -2
    client.responses.create(model=MODEL, input="hi", max_output_tokens=16, extra_body={"priority": 4})
    assert engine.priorities[-1] == 4
    with pytest.raises(openai.BadRequestError) as oe:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"priority": "high"})
    assert oe.value.param == "priority"  # type: ignore[attr-defined]
    claude = anthropic.Anthropic(base_url=srv.root_url, api_key="x", max_retries=0)
    claude.messages.create(model=MODEL, max_tokens=2, messages=USER, extra_body={"priority": 1})  # type: ignore[arg-type]
    assert engine.priorities[-1] == 1
    with pytest.raises(anthropic.BadRequestError, match="priority"):
        claude.messages.create(model=MODEL, max_tokens=2, messages=USER, extra_body={"priority": 0.5})  # type: ignore[arg-type]
