"""POST /v1/responses (and GET / DELETE /v1/responses/{id}) through the HTTP layer on the fake engine,
with the `openai` SDK: output items and semantic stream events, tool calls read from a scripted
answer (streamed and not, the same items), a call cut by max_output_tokens, the store and
`previous_response_id`, fields accepted, ignored and refused, per-endpoint metrics.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from fake_engine import FakeEngine
from http_helpers import assert_error, post, request, serving
from rel_helpers import send
from rillet.http.background import BackgroundServer

MODEL = "fake-model"
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": True,
    }
]
REPLY = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)
ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


@pytest.fixture
def served(
    make_fake: Callable[..., FakeEngine],
) -> Iterator[tuple[openai.OpenAI, FakeEngine, BackgroundServer]]:
    engine = make_fake()
    with serving(engine) as srv:
        yield openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0), engine, srv


def _collapse(types: list[str]) -> list[str]:
    """Runs of the same event type as one (the deltas)."""
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


def test_text_answer_streamed_and_not(served: Any) -> None:
    client, _, _ = served
    r = client.responses.create(model=MODEL, input="Hello", max_output_tokens=12, temperature=0)
    assert (
        r.status == "incomplete"
        and r.incomplete_details
        and r.incomplete_details.reason == "max_output_tokens"
    )
    assert r.output_text and r.usage and r.usage.output_tokens == 12
    assert r.usage.total_tokens == r.usage.input_tokens + 12
    with client.responses.stream(model=MODEL, input="Hello", max_output_tokens=12, temperature=0) as stream:
        events = list(stream)
    types = [e.type for e in events]
    assert _collapse(types) == [*ORDER, "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == r.output_text  # greedy: the same text
    final = events[-1].response
    assert final.status == "incomplete" and final.output_text == deltas and final.usage.output_tokens == 12


def test_a_finished_answer_is_completed(served: Any) -> None:
    client, engine, _ = served
    engine.reply = b"Hi there."
    r = client.responses.create(model=MODEL, input="Hello")
    assert r.status == "completed" and r.output_text == "Hi there." and r.incomplete_details is None
    with client.responses.stream(model=MODEL, input="Hello") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == "Hi there."


def _calls(output: list[Any]) -> list[tuple[str, dict[str, Any], str]]:
    return [(o.name, json.loads(o.arguments), o.status) for o in output if o.type == "function_call"]


def test_function_calls_streamed_and_not(served: Any) -> None:
    client, engine, _ = served
    engine.reply = REPLY.encode()
    r = client.responses.create(model=MODEL, input="weather?", tools=TOOLS)
    assert [o.type for o in r.output] == ["message", "function_call", "function_call"]
    assert r.output[0].content[0].text == "Let me check.\n"  # as streamed: the deltas join to it
    want = [("get_weather", {"city": "Paris"}, "completed"), ("get_weather", {"city": "Rome"}, "completed")]
    assert _calls(r.output) == want
    assert len({o.call_id for o in r.output[1:]}) == 2 and r.status == "completed"
    with client.responses.stream(model=MODEL, input="weather?", tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert _calls(final.output) == want and final.output_text == "Let me check.\n"
    args = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert {e.output_index for e in args} == {1, 2}
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [e.item.type for e in done] == ["message", "function_call", "function_call"]


def test_a_call_cut_by_max_output_tokens_is_never_completed(served: Any) -> None:
    client, engine, _ = served
    reply = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris, France, Europe"}}\n</tool_call>'
    )
    engine.reply = reply.encode()
    cut = reply.index("France")  # tokens are bytes: the answer ends inside the arguments
    r = client.responses.create(model=MODEL, input="w?", tools=TOOLS, max_output_tokens=cut)
    assert r.status == "incomplete"
    assert [(o.type, o.status) for o in r.output] == [("function_call", "incomplete")]
    with client.responses.stream(model=MODEL, input="w?", tools=TOOLS, max_output_tokens=cut) as stream:
        events = list(stream)
    assert events[-1].type == "response.incomplete"
    assert [(o.type, o.status) for o in events[-1].response.output] == [("function_call", "incomplete")]


def _items(output: list[Any]) -> list[tuple[str, str, str]]:
    """(type, text or name + arguments, status) of each output item, in order."""
    return [
        (o.type, o.content[0].text if o.type == "message" else o.name + o.arguments, o.status) for o in output
    ]


def _both(client: openai.OpenAI, **kwargs: Any) -> tuple[Any, Any]:
    """The non-streamed response and the stream's final one."""
    r = client.responses.create(model=MODEL, input="weather?", tools=TOOLS, **kwargs)
    with client.responses.stream(model=MODEL, input="weather?", tools=TOOLS, **kwargs) as stream:
        events = list(stream)
    return r, events[-1].response


def test_parallel_tool_calls_false_answers_one_call(served: Any) -> None:
    client, engine, _ = served
    engine.reply = REPLY.encode()
    r, final = _both(client, parallel_tool_calls=False)
    assert _calls(r.output) == [("get_weather", {"city": "Paris"}, "completed")]
    assert _items(final.output) == _items(r.output) and r.status == final.status == "completed"


@pytest.mark.parametrize("case", ["text after a call", "cut inside a second call's tag"])
def test_items_come_in_the_order_generated(served: Any, case: str) -> None:
    """Text after a call is an item after it, with the status the stream gave it, in both paths."""
    client, engine, _ = served
    first = REPLY[: REPLY.index("</tool_call>") + len("</tool_call>")]
    if case == "text after a call":
        engine.reply = (first + "\nDone.").encode()
        r, final = _both(client)
        assert [(t, s) for t, _, s in _items(r.output)] == [
            ("message", "completed"),
            ("function_call", "completed"),
            ("message", "completed"),
        ]
    else:
        engine.reply = REPLY.encode()
        r, final = _both(client, max_output_tokens=len(first) + 6)  # "\n<tool" of the second
        assert [(t, s) for t, _, s in _items(r.output)] == [
            ("message", "completed"),
            ("function_call", "completed"),
            ("message", "incomplete"),
        ]
    assert _items(final.output) == _items(r.output) and final.status == r.status


def test_function_call_output_continues_the_conversation(served: Any) -> None:
    client, engine, _ = served
    engine.reply = REPLY.encode()
    first = client.responses.create(model=MODEL, input="weather?", tools=TOOLS)
    engine.reply = b"Sunny in both."
    call = first.output[1]
    items = [
        {"role": "user", "content": "weather?"},
        *[o.model_dump(exclude_none=True) for o in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear"}'},
    ]
    second = client.responses.create(model=MODEL, input=items, tools=TOOLS)
    assert second.output_text == "Sunny in both."
    chained = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear"}'}],
        tools=TOOLS,
    )
    assert chained.output_text == "Sunny in both."
    # the stored conversation is the one sent in full: the same prompt
    assert chained.usage and second.usage and chained.usage.input_tokens == second.usage.input_tokens


def test_store_get_delete_and_previous_response_id(served: Any) -> None:
    client, engine, srv = served
    engine.reply = b"Paris."
    r = client.responses.create(model=MODEL, input="Capital of France?", instructions="Be brief.")
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump() and got.instructions == "Be brief."
    follow = client.responses.create(model=MODEL, input="And of Italy?", previous_response_id=r.id)
    assert follow.previous_response_id == r.id
    # without the instructions (not carried over) but with the first turn and its answer
    assert follow.usage and r.usage and follow.usage.input_tokens > r.usage.input_tokens
    assert client.responses.delete(r.id) is None
    for method in ("GET", "DELETE"):
        assert_error(
            request(srv, method, f"/v1/responses/{r.id}"), 404, param="response_id", code="not_found"
        )
    resp = post(srv, "/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": r.id})
    assert_error(resp, 404, param="previous_response_id", code="not_found")
    unstored = client.responses.create(model=MODEL, input="x", store=False)
    assert_error(request(srv, "GET", f"/v1/responses/{unstored.id}"), 404)


def test_store_is_bounded(make_fake: Callable[..., FakeEngine]) -> None:
    engine = make_fake()
    engine.reply = b"ok"
    with serving(engine, "responses.store_size=2") as srv:
        ids = [post(srv, "/v1/responses", {"model": MODEL, "input": str(i)}).json()["id"] for i in range(3)]
        assert [request(srv, "GET", f"/v1/responses/{i}").status_code for i in ids] == [404, 200, 200]


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("background", True, "background"),
        ("conversation", "conv_1", "conversation"),
        ("prompt", {"id": "pmpt_1"}, "prompt"),
        ("top_logprobs", 2, "top_logprobs"),
        ("include", ["message.output_text.logprobs"], "include"),
        ("tools", [{"type": "web_search"}], "tools[0].type"),
        ("tools", [{"type": "function", "name": "bad name"}], "tools[0].name"),
        ("tool_choice", {"type": "function", "name": "nope"}, "tool_choice"),
        (
            "input",
            [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            "input[0].content[0]",  # the model does not take images
        ),
        ("input", [{"type": "item_reference", "id": "x"}], "input[0].type"),
        ("input", [{"type": "function_call", "name": "f"}], "input[0].arguments"),
        ("input", 5, "input"),
        ("text", {"format": {"type": "xml"}}, "text.format.type"),
        ("max_output_tokens", 0, "max_output_tokens"),
        ("temperature", "hot", "temperature"),
        ("logit_bias", {"999": 1}, "logit_bias"),
        ("model", "gpt-5", "model"),
    ],
)
def test_refused_fields_name_themselves(served: Any, field: str, value: Any, param: str) -> None:
    _, _, srv = served
    resp = post(srv, "/v1/responses", {"model": MODEL, "input": "hi", field: value})
    assert_error(resp, 404 if field == "model" else 400, param=param)


def test_ignored_fields_pass(served: Any) -> None:
    _, engine, srv = served
    engine.reply = b"ok"
    body = {
        "model": MODEL,
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "hi"}]}
        ],
        "reasoning": {"effort": "low"},
        "include": ["reasoning.encrypted_content"],
        "truncation": "auto",
        "text": {"format": {"type": "text"}, "verbosity": "low"},
        "metadata": {"k": "v"},
        "user": "u",
        "service_tier": "auto",
        "stream_options": {"include_obfuscation": False},
        "top_k": 5,
        "seed": 3,
        "stop": ["zz"],
        "logit_bias": {"5": -100},
    }
    resp = post(srv, "/v1/responses", body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["metadata"] == {"k": "v"} and resp.json()["reasoning"] == {"effort": "low"}


def test_metrics_count_requests_per_endpoint(served: Any) -> None:
    client, engine, srv = served
    engine.reply = b"ok"
    client.responses.create(model=MODEL, input="x")
    post(
        srv, "/v1/messages", {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}
    )
    text = request(srv, "GET", "/metrics").text
    assert 'rillet_requests_total{endpoint="/v1/responses",status="200"} 1.0' in text
    assert 'rillet_requests_total{endpoint="/v1/messages",status="200"} 1.0' in text


def test_a_failure_mid_stream_ends_the_open_item_and_keeps_the_output(served: Any) -> None:
    """The fake engine fails a `__fail__` request after 3 tokens: the message item it was streaming
    ends `incomplete` (its output_item.done), then error and response.failed with that output."""
    _, _, srv = served

    async def run() -> list[Any]:
        body = {"model": MODEL, "input": "__fail__", "max_output_tokens": 50, "stream": True}
        raw = await send(srv.port, "/v1/responses", body)
        await raw.read_head()
        data = await raw.body()
        raw.close()
        return [json.loads(b.split(b"\ndata: ")[1]) for b in data.split(b"\n\n") if b.strip()]

    events = asyncio.run(run())
    types = [e["type"] for e in events]
    assert types[-3:] == ["response.output_item.done", "error", "response.failed"], types
    item = events[-3]["item"]
    assert item["type"] == "message" and item["status"] == "incomplete" and item["content"][0]["text"]
    assert events[-1]["response"]["output"] == [item]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_input_items_list_a_stored_responses_input(served: Any) -> None:
    """GET /v1/responses/{id}/input_items through the SDK: the request's own items, newest first
    by default, a page at a time."""
    client, engine, srv = served
    engine.reply = b"ok"
    r = client.responses.create(model=MODEL, input="Hello there")
    (only,) = client.responses.input_items.list(r.id).data
    assert only.type == "message" and only.role == "user" and only.id.startswith("msg_")
    assert [(p.type, p.text) for p in only.content] == [("input_text", "Hello there")]
    turns = [
        {"role": "system", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one"}], "id": "a"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
    ]
    r = client.responses.create(model=MODEL, input=turns, previous_response_id=r.id)  # type: ignore[arg-type]
    asc = client.responses.input_items.list(r.id, order="asc").data
    assert [(i.role, i.content[0].text) for i in asc] == [
        ("system", "Be brief."),
        ("user", "one"),
        ("assistant", "two"),
        ("user", "three"),
    ]  # this request's input only; the earlier one's are that response's
    assert asc[1].id == "a" and asc[2].content[0].type == "output_text"
    page = client.responses.input_items.list(r.id, limit=2)
    assert [i.id for i in page.data] == [asc[3].id, asc[2].id] and page.has_more
    rest = client.responses.input_items.list(r.id, limit=2, after=page.data[-1].id)
    assert [i.id for i in rest.data] == [asc[1].id, asc[0].id] and not rest.has_more
    assert_error(request(srv, "GET", f"/v1/responses/{r.id}/input_items?limit=0"), 400)
    assert_error(request(srv, "GET", f"/v1/responses/{r.id}/input_items?order=up"), 400)
    assert_error(request(srv, "GET", "/v1/responses/resp_nope/input_items"), 404)
    unstored = client.responses.create(model=MODEL, input="x", store=False)
    assert_error(request(srv, "GET", f"/v1/responses/{unstored.id}/input_items"), 404)
