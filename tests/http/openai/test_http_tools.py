"""Tool calls read from the model's text (tool_choice auto) through the HTTP layer, on the fake engine
scripted to answer a fixed text: the non-streamed `message.tool_calls`, the streamed
`delta.tool_calls` (id, type and name first, then argument fragments), content around calls, and
the prompt the tools are injected into. Also: without a grammar engine, structured requests are 400s.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from fake_engine import FakeEngine, FakeTokenizer
from http_helpers import serving
from pydantic import BaseModel
from rillet.http.openai.protocol import Limits, parse_chat
from rillet.http.openai.tool_prompt import TOOLS_INTRO

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


class Weather(BaseModel):
    city: str


REPLY = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n'
    '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)


@pytest.fixture
def scripted(make_fake: Callable[..., FakeEngine]) -> Iterator[tuple[openai.OpenAI, FakeEngine]]:
    engine = make_fake()
    with serving(engine) as srv:
        yield openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0), engine


def _ask(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "weather?"}],
        tools=TOOLS,
        **{"max_tokens": 400, **kwargs},
    )


def test_auto_tool_calls_non_streamed(scripted: tuple[openai.OpenAI, FakeEngine]) -> None:
    client, engine = scripted
    engine.reply = REPLY.encode()
    r = _ask(client, temperature=0)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.content == "Let me check."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []] == [
        ("get_weather", {"city": "Paris", "days": [1, 2]}),
        ("get_weather", {"city": "Rome"}),
    ]
    assert len({c.id for c in msg.tool_calls or []}) == 2


def test_auto_tool_calls_streamed(scripted: tuple[openai.OpenAI, FakeEngine]) -> None:
    client, engine = scripted
    engine.reply = REPLY.encode()
    deltas, content, finish = [], "", None
    for chunk in _ask(client, temperature=0, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            deltas += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and content == "Let me check.\n"
    starts = [d for d in deltas if d.id is not None]
    assert [(d.index, d.type, d.function.name, d.function.arguments) for d in starts] == [
        (0, "function", "get_weather", ""),
        (1, "function", "get_weather", ""),
    ]
    args = ["".join(d.function.arguments or "" for d in deltas if d.index == i) for i in (0, 1)]
    assert [json.loads(a) for a in args] == [{"city": "Paris", "days": [1, 2]}, {"city": "Rome"}]
    assert sum(1 for d in deltas if d.index == 0) > 2  # arguments arrive in fragments as generated


def test_a_call_cut_by_max_tokens_is_not_a_call(scripted: tuple[openai.OpenAI, FakeEngine]) -> None:
    """Non-streamed: only whole calls (the second is cut mid-arguments), finish_reason length.
    Streamed: its fragments went out as generated, so the answer ends with `length`, not
    `tool_calls`: the SDK's stream accumulator raises LengthFinishReasonError on it."""
    client, engine = scripted
    engine.reply = REPLY.encode()
    cut = REPLY.index('"Rome"') + 3  # inside the second call's arguments (one byte a token)
    r = _ask(client, temperature=0, max_tokens=cut)
    assert r.choices[0].finish_reason == "length"
    calls = r.choices[0].message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": [1, 2]})
    ]
    finish = [
        c.finish_reason
        for chunk in _ask(client, temperature=0, max_tokens=cut, stream=True)
        for c in chunk.choices
    ]
    assert finish[-1] == "length"
    tool = openai.pydantic_function_tool(Weather, name="get_weather")
    with (
        pytest.raises(openai.LengthFinishReasonError),
        client.chat.completions.stream(
            model="fake-model", messages=[{"role": "user", "content": "?"}], tools=[tool], max_tokens=cut
        ) as stream,
    ):
        for _ in stream:
            pass


ODD_BLOCKS = {
    # arguments of another JSON type: not a call (a function takes an object), in either path
    "string arguments": ('<tool_call>\n{"name": "get_weather", "arguments": "Tokyo"}\n</tool_call>', None),
    "number arguments": ('<tool_call>\n{"name": "get_weather", "arguments": 7}\n</tool_call>', None),
    # a string that holds an object: read whole once the block closes
    "object in a string": (
        '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}\n</tool_call>',
        '{"city": "Oslo"}',
    ),
    # an object that is not valid JSON: streamed as generated once it opened, so a call in both
    "garbled object": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": Oslo}}\n</tool_call>',
        '{"city": Oslo}',
    ),
}


@pytest.mark.parametrize("case", list(ODD_BLOCKS))
def test_odd_tool_blocks_answer_the_same_streamed_and_not(
    scripted: tuple[openai.OpenAI, FakeEngine], case: str
) -> None:
    """What a stream sends cannot be taken back, so the non-streamed answer is what the stream's
    events add up to: the same content, calls and finish reason."""
    client, engine = scripted
    block, args = ODD_BLOCKS[case]
    engine.reply = ("Sure.\n" + block).encode()
    r = _ask(client, temperature=0)
    msg = r.choices[0].message
    plain = (msg.content, [(c.function.name, c.function.arguments) for c in msg.tool_calls or []])
    content, deltas, finish = "", [], None
    for chunk in _ask(client, temperature=0, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            deltas += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    names = [d.function.name for d in deltas if d.id is not None]
    streamed = (content or None, [(n, "".join(d.function.arguments or "" for d in deltas)) for n in names])
    if args is None:
        assert plain == ("Sure.\n" + block, []) and r.choices[0].finish_reason == "stop"
    else:
        assert plain == ("Sure.", [("get_weather", args)]) and r.choices[0].finish_reason == "tool_calls"
    assert (streamed[0] or "").strip() == (plain[0] or "") and streamed[1] == plain[1]
    assert finish == r.choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_before_its_arguments_leaves_no_markup(
    scripted: tuple[openai.OpenAI, FakeEngine], stream: bool
) -> None:
    """Cut inside the second call's head: the first call, no half `<tool_call>{"name"...` as text."""
    client, engine = scripted
    engine.reply = REPLY.encode()
    cut = REPLY.index('"arguments": {"city": "Rome"')  # one byte a token
    if stream:
        content, deltas = "", []
        for chunk in _ask(client, temperature=0, max_tokens=cut, stream=True):
            for c in chunk.choices:
                content += c.delta.content or ""
                deltas += c.delta.tool_calls or []
        assert content.strip() == "Let me check."
        assert [d.function.name for d in deltas if d.id] == ["get_weather"]
    else:
        msg = _ask(client, temperature=0, max_tokens=cut).choices[0].message
        assert msg.content == "Let me check." and len(msg.tool_calls or []) == 1


def test_parallel_tool_calls_false_gives_one_call(scripted: tuple[openai.OpenAI, FakeEngine]) -> None:
    client, engine = scripted
    engine.reply = REPLY.encode()
    r = _ask(client, temperature=0, parallel_tool_calls=False)
    calls = r.choices[0].message.tool_calls or []
    assert r.choices[0].finish_reason == "tool_calls" and [c.function.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris", "days": [1, 2]}
    streamed: dict[int, str] = {}
    for chunk in _ask(client, temperature=0, parallel_tool_calls=False, stream=True):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                streamed[d.index] = streamed.get(d.index, "") + (d.function.arguments or "")
    assert list(streamed) == [0] and json.loads(streamed[0]) == {"city": "Paris", "days": [1, 2]}


def test_forced_calls_are_one_without_parallel_and_bounded_with_it() -> None:
    from rillet.core.structured.json_style import FLEXIBLE
    from rillet.http.openai.tools import parse_tools

    one = parse_tools({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False})
    many = parse_tools({"tools": TOOLS, "tool_choice": "required"})
    assert one is not None and many is not None
    one_spec, many_spec = one.grammar(FLEXIBLE, 8), many.grammar(FLEXIBLE, 8)
    assert one_spec is not None and many_spec is not None
    assert one_spec.source.startswith("start: call\n")
    assert many_spec.source.startswith('start: call ("\\n" call){0,7}\n')
    assert json.dumps(FLEXIBLE) in many_spec.source  # the calls' JSON laid out as the engine's


def test_plain_answer_with_tools_is_content(scripted: tuple[openai.OpenAI, FakeEngine]) -> None:
    client, engine = scripted
    engine.reply = b"It is sunny <tool_ maybe."
    r = _ask(client, temperature=0)
    assert (
        r.choices[0].finish_reason == "stop" and r.choices[0].message.content == "It is sunny <tool_ maybe."
    )
    assert not r.choices[0].message.tool_calls


def test_structured_request_without_grammar_engine_is_400(scripted: tuple[openai.OpenAI, FakeEngine]) -> None:
    client, _ = scripted
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_object"},
            max_tokens=4,
        )
    assert err.value.body["code"] == "structured_outputs_unavailable"  # type: ignore[index]
    assert "llguidance" in err.value.body["message"]  # type: ignore[index]


def test_tools_injected_into_the_system_prompt_and_tool_turns_rendered() -> None:
    tok = FakeTokenizer()
    limits = Limits("m", 4096, 1024, 16, 4)
    body = {
        "model": "m",
        "tools": TOOLS,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        ],
    }
    text = tok.decode(parse_chat(body, tok, limits).prompts[0])
    assert text.startswith("<system>Be brief.\n\n" + TOOLS_INTRO)
    assert '{"type": "function", "function": {"name": "get_weather"' in text
    assert (
        '<assistant><tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        in text
    )
    assert "<user><tool_response>\nrain\n</tool_response>\n<assistant>" in text
