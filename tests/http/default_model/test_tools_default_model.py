"""Tool calling end to end on the real default model with the `openai` client: round trips
(tool_calls -> a tool message -> a final answer) forced by `required` and by a named function, the
final turn under `auto`; streamed tool-call deltas in OpenAI's shape; bad tool definitions are 400s.

The default SmolLM2 template does not render tools, so they reach the model through the system
prompt (http/openai/tool_prompt.py), and forced calls are constrained by the tools' schemas.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

# minutes on one core: its module is queued first under --dist loadfile (tests/conftest.py)
pytestmark = pytest.mark.slow

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}}, "required": ["zone"]}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "Current time in a zone", "parameters": TIME},
    },
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
QUESTION = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def _streamed_calls(chunks: Any) -> tuple[list[dict[str, Any]], str | None, str]:
    """Tool calls assembled from `delta.tool_calls` the way OpenAI's clients do it."""
    calls: dict[int, dict[str, Any]] = {}
    finish, content = None, ""
    for chunk in chunks:
        for c in chunk.choices:
            content += c.delta.content or ""
            finish = c.finish_reason or finish
            for tc in c.delta.tool_calls or []:
                if tc.index not in calls:  # the first delta of a call: id, type and name
                    assert tc.id and tc.type == "function" and tc.function.name
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id is None and tc.function.name is None
                calls[tc.index]["arguments"] += tc.function.arguments or ""
    return [calls[i] for i in sorted(calls)], finish, content


def _round_trip(client: openai.OpenAI, model: str, choice: Any, stream: bool) -> None:
    base = {"model": model, "tools": TOOLS, "max_tokens": 80, "temperature": 0}
    if stream:
        chunks = client.chat.completions.create(
            **base, messages=QUESTION, tool_choice=choice, parallel_tool_calls=False, stream=True
        )
        calls, finish, _ = _streamed_calls(chunks)
    else:
        r = client.chat.completions.create(
            **base, messages=QUESTION, tool_choice=choice, parallel_tool_calls=False
        )
        finish = r.choices[0].finish_reason
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in r.choices[0].message.tool_calls or []
        ]
    assert finish == "tool_calls" and len(calls) == 1
    call = calls[0]
    args = json.loads(call["arguments"])
    jsonschema.validate(args, SCHEMAS[call["name"]])
    if isinstance(choice, dict):
        assert call["name"] == choice["function"]["name"]
    history = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": call["id"],
            "content": json.dumps({"temperature_c": 21, "sky": "clear"}),
        },
    ]
    final = client.chat.completions.create(
        **base, messages=history, tool_choice="auto", max_completion_tokens=40
    )
    msg = final.choices[0].message
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert (msg.content or "").strip() or msg.tool_calls  # an answer came back on the next turn


@pytest.mark.parametrize("stream", [False, True])
def test_round_trip_required(client: openai.OpenAI, model: str, stream: bool) -> None:
    _round_trip(client, model, "required", stream)


@pytest.mark.parametrize("stream", [False, True])
def test_round_trip_named(client: openai.OpenAI, model: str, stream: bool) -> None:
    _round_trip(client, model, {"type": "function", "function": {"name": "get_time"}}, stream)


def test_parallel_required_calls_all_parse(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=120,
        temperature=0.7,
        seed=3,
    )
    calls = r.choices[0].message.tool_calls or []
    assert calls
    complete = calls if r.choices[0].finish_reason == "tool_calls" else calls[:-1]  # a cut-off last call
    for c in complete:
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def test_none_and_auto_answer_in_text(client: openai.OpenAI, model: str) -> None:
    for choice in ("none", "auto"):
        r = client.chat.completions.create(
            model=model, messages=QUESTION, tools=TOOLS, tool_choice=choice, max_tokens=12, temperature=0
        )
        assert r.choices[0].message.content


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]},
            "tools",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}},
            "tool_choice",
        ),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS + TOOLS[:1]}, "tools[2].function.name"),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
    ],
)
def test_bad_tool_definitions_are_400(
    client: openai.OpenAI, model: str, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4, extra_body=extra)
    assert err.value.body["param"] == param  # type: ignore[index]
