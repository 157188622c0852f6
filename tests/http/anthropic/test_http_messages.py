"""POST /v1/messages and /v1/messages/count_tokens through the HTTP layer on the fake engine, with the
`anthropic` SDK: content blocks and stream events, stop reasons (end_turn, max_tokens,
stop_sequence, tool_use), tool_use read from a scripted answer (streamed and not), a call cut by
max_tokens, errors in Anthropic's shape with the SDK's exception classes, x-api-key, pings while
the engine holds a stream idle.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest
from fake_engine import FakeEngine
from http_helpers import post, request, serving
from rel_helpers import send
from rillet.http.background import BackgroundServer

MODEL = "fake-model"
TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
REPLY = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
USER = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def served(
    make_fake: Callable[..., FakeEngine],
) -> Iterator[tuple[anthropic.Anthropic, FakeEngine, BackgroundServer]]:
    engine = make_fake()
    with serving(engine, "stream.ping_interval_s=0.05") as srv:
        yield anthropic.Anthropic(base_url=srv.root_url, api_key="x", max_retries=0), engine, srv


def is_anthropic_error(body: Any) -> bool:
    return (
        isinstance(body, dict)
        and set(body) == {"type", "error"}
        and body["type"] == "error"
        and set(body["error"]) == {"type", "message"}
        and isinstance(body["error"]["message"], str)
        and bool(body["error"]["message"])
    )


def test_text_streamed_and_not(served: Any) -> None:
    client, _, _ = served
    m = client.messages.create(model=MODEL, max_tokens=10, messages=USER, extra_body={"temperature": 0})
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 10
    assert [b.type for b in m.content] == ["text"]
    with client.messages.stream(
        model=MODEL, max_tokens=10, messages=USER, extra_body={"temperature": 0}
    ) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == m.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 10


def test_end_turn_and_stop_sequence(served: Any) -> None:
    client, engine, _ = served
    m = client.messages.create(
        model=MODEL, max_tokens=60, messages=USER, stop_sequences=["fox"], extra_body={"temperature": 0}
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "fox"
    assert "fox" not in m.content[0].text
    with client.messages.stream(
        model=MODEL, max_tokens=60, messages=USER, stop_sequences=["fox"], extra_body={"temperature": 0}
    ) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "fox"
    engine.reply = b"Hi."
    m = client.messages.create(model=MODEL, max_tokens=40, messages=USER)
    assert m.stop_reason == "end_turn" and m.stop_sequence is None and m.content[0].text == "Hi."


def test_tool_use_streamed_and_not(served: Any) -> None:
    client, engine, _ = served
    engine.reply = REPLY.encode()
    m = client.messages.create(model=MODEL, max_tokens=200, messages=USER, tools=TOOLS)
    assert m.stop_reason == "tool_use"
    assert [b.type for b in m.content] == ["text", "tool_use"]
    use = m.content[1]
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")
    with client.messages.stream(model=MODEL, max_tokens=200, messages=USER, tools=TOOLS) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
        ("text", None),
        ("tool_use", {"city": "Paris"}),
    ]
    assert final.content[0].text == m.content[0].text
    # the round trip: tool_use in the assistant turn, tool_result in the next user turn
    engine.reply = b"Sunny."
    turns = [
        *USER,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "clear sky"}]},
    ]
    again = client.messages.create(model=MODEL, max_tokens=50, messages=turns, tools=TOOLS)
    assert again.stop_reason == "end_turn" and again.content[0].text == "Sunny."


def test_a_call_cut_by_max_tokens_is_not_a_tool_use(served: Any) -> None:
    client, engine, _ = served
    engine.reply = REPLY.encode()
    cut = REPLY.index("Paris")
    m = client.messages.create(model=MODEL, max_tokens=cut, messages=USER, tools=TOOLS)
    assert m.stop_reason == "max_tokens" and [b.type for b in m.content] == ["text"]
    with client.messages.stream(model=MODEL, max_tokens=cut, messages=USER, tools=TOOLS) as s:
        final = s.get_final_message()
    assert final.stop_reason == "max_tokens"


def _blocks(content: list[Any]) -> list[tuple[str, Any]]:
    return [(b.type, b.text if b.type == "text" else (b.name, b.input)) for b in content]


def _both(client: anthropic.Anthropic, **kwargs: Any) -> tuple[Any, Any]:
    """The non-streamed message and the stream's final one."""
    m = client.messages.create(model=MODEL, max_tokens=400, messages=USER, tools=TOOLS, **kwargs)
    with client.messages.stream(model=MODEL, max_tokens=400, messages=USER, tools=TOOLS, **kwargs) as s:
        return m, s.get_final_message()


def test_disable_parallel_tool_use_answers_one_call(served: Any) -> None:
    client, engine, _ = served
    engine.reply = (REPLY + "\n" + REPLY.replace("Let me check.\n", "").replace("Paris", "Rome")).encode()
    m, final = _both(client, tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    paris = ("tool_use", ("get_weather", {"city": "Paris"}))
    assert _blocks(m.content) == [("text", "Let me check.\n"), paris]
    assert _blocks(final.content) == _blocks(m.content) and m.stop_reason == final.stop_reason == "tool_use"
    m, _ = _both(client)
    assert len(m.content) == 3  # with parallel use: both calls


def test_blocks_come_in_the_order_generated(served: Any) -> None:
    client, engine, _ = served
    engine.reply = (REPLY.replace("Let me check.\n", "") + "\nDone.").encode()
    m, final = _both(client)
    assert _blocks(m.content) == [("tool_use", ("get_weather", {"city": "Paris"})), ("text", "Done.")]
    assert _blocks(final.content) == _blocks(m.content) and m.stop_reason == final.stop_reason == "tool_use"


def test_count_tokens(served: Any) -> None:
    client, _, _ = served
    n = client.messages.count_tokens(model=MODEL, messages=USER, system="Be brief.").input_tokens
    m = client.messages.create(model=MODEL, max_tokens=2, messages=USER, system="Be brief.")
    assert n == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0


def test_errors_are_in_anthropic_shape(served: Any) -> None:
    client, _, srv = served
    for path in ("/v1/messages", "/v1/messages/count_tokens"):  # no route for GET: a 405, its way
        resp = request(srv, "GET", path)
        assert resp.status_code == 405 and is_anthropic_error(resp.json()), resp.text
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.create(model=MODEL, messages=USER, max_tokens=anthropic.omit, timeout=30)  # not sent
    assert exc.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in exc.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-x", max_tokens=3, messages=USER)
    cases = [
        {"model": MODEL, "max_tokens": 3, "messages": []},
        {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
        {"model": MODEL, "max_tokens": 3, "messages": [*USER, {"role": "assistant", "content": "Sure"}]},
        {
            "model": MODEL,
            "max_tokens": 3,
            "messages": USER,
            "tools": [{"type": "web_search_20250305", "name": "w"}],
        },
        {
            "model": MODEL,
            "max_tokens": 3,
            "messages": USER,
            "tool_choice": {"type": "tool", "name": "x"},
            "tools": TOOLS,
        },
        {"model": MODEL, "max_tokens": 3, "messages": USER, "stop_sequences": [""]},
        {"model": MODEL, "max_tokens": 0, "messages": USER},
        {"model": MODEL, "max_tokens": 3, "messages": USER, "container": "c"},
    ]
    for body in cases:
        resp = post(srv, "/v1/messages", body)
        assert resp.status_code == 400 and is_anthropic_error(resp.json()), (body, resp.text)
        assert resp.json()["error"]["type"] == "invalid_request_error"
    resp = post(srv, "/v1/messages", b"{not json")
    assert resp.status_code == 400 and is_anthropic_error(resp.json())


def test_x_api_key(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake()
    engine.reply = b"ok"
    with serving(engine, "server.api_keys=[k1]") as srv:
        good = anthropic.Anthropic(base_url=srv.root_url, api_key="k1", max_retries=0)
        assert good.messages.create(model=MODEL, max_tokens=3, messages=USER).content[0].text == "ok"
        with pytest.raises(anthropic.AuthenticationError) as exc:
            anthropic.Anthropic(base_url=srv.root_url, api_key="k2", max_retries=0).messages.create(
                model=MODEL, max_tokens=3, messages=USER
            )
        assert exc.value.body["error"]["type"] == "authentication_error"
        body = {"model": MODEL, "input": "x"}
        assert post(srv, "/v1/responses", body, {"x-api-key": "k1"}).status_code == 200
        assert post(srv, "/v1/responses", body, {"x-api-key": "k2"}).status_code == 401


def test_pings_while_the_stream_is_idle(served: Any) -> None:
    _, engine, srv = served

    async def run() -> list[str]:
        engine.steps_allowed.clear()  # the request waits: nothing to stream
        raw = await send(
            srv.port, "/v1/messages", {"model": MODEL, "max_tokens": 3, "messages": USER, "stream": True}
        )
        await raw.read_head()
        seen: list[str] = []
        buf = b""
        async for chunk in raw.chunks():
            buf += chunk
            *blocks, buf = buf.split(b"\n\n")
            for block in blocks:
                seen.append(block.split(b"\n")[0].decode())
            if seen.count("event: ping") >= 3 and not engine.steps_allowed.is_set():
                engine.steps_allowed.set()
        raw.close()
        return seen

    seen = asyncio.run(run())
    assert seen[:2] == ["event: message_start", "event: ping"]
    assert seen.count("event: ping") >= 3
    assert seen[-2:] == ["event: message_delta", "event: message_stop"]
    first_block = seen.index("event: content_block_start")
    assert "event: ping" in seen[2:first_block]  # pinged while idle, before any output


def test_streamed_error_event(served: Any) -> None:
    _, engine, srv = served
    engine.fail_request_ids = set()

    async def run() -> list[Any]:
        raw = await send(
            srv.port,
            "/v1/messages",
            {
                "model": MODEL,
                "max_tokens": 50,
                "messages": [{"role": "user", "content": "__fail__"}],
                "stream": True,
            },
        )
        await raw.read_head()
        data = await raw.body()
        raw.close()
        return [json.loads(b.split(b"\ndata: ")[1]) for b in data.split(b"\n\n") if b.strip()]

    events = asyncio.run(run())
    assert events[-1]["type"] == "error" and is_anthropic_error(events[-1])
