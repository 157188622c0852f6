"""responses/: input items -> chat messages, tools and tool_choice -> the chat path's ToolSetup,
text.format -> a grammar, instructions, the store's bound and time to live."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fake_engine import FakeTokenizer
from rillet.http.openai.errors import ApiError
from rillet.http.openai.protocol import Limits
from rillet.http.responses.items import input_messages
from rillet.http.responses.protocol import parse_responses
from rillet.http.responses.store import ResponseStore

LIMITS = Limits("m", 4096, 512, 64, 4, vocab_size=257)
FN = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}


def test_items_become_chat_messages() -> None:
    items = [
        {"role": "developer", "content": "rules"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "calling", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
    ]
    assert input_messages(items) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "a\nb"},
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "content": "one", "tool_call_id": "c1"},
        {"role": "tool", "content": "two", "tool_call_id": "c2"},
    ]
    assert input_messages("hi") == [{"role": "user", "content": "hi"}]


def _parse(**body: Any) -> Any:
    return parse_responses({"model": "m", "input": "hi", **body}, FakeTokenizer(), LIMITS)


def test_instructions_lead_and_are_not_stored() -> None:
    req = _parse(instructions="Be brief.", max_output_tokens=7, temperature=0)
    assert req.gen.prompts[0] == list(b"<system>Be brief.\n<user>hi\n<assistant>")
    assert req.messages == [{"role": "user", "content": "hi"}]
    assert req.gen.params[0].max_tokens == 7 and req.gen.params[0].greedy and req.store
    assert req.echo["instructions"] == "Be brief." and req.echo["max_output_tokens"] == 7
    prior = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    follow = parse_responses({"model": "m", "input": "next"}, FakeTokenizer(), LIMITS, prior)
    assert follow.messages == [*prior, {"role": "user", "content": "next"}]


@pytest.mark.parametrize(
    ("choice", "mode", "named"),
    [
        (None, "auto", None),
        ("auto", "auto", None),
        ("required", "required", None),
        ({"type": "function", "name": "f"}, "named", "f"),
    ],
)
def test_tool_choice_maps_to_the_chat_modes(choice: Any, mode: str, named: str | None) -> None:
    req = _parse(tools=[FN], tool_choice=choice)
    assert req.gen.tools is not None and (req.gen.tools.mode, req.gen.tools.named) == (mode, named)
    assert (req.gen.grammar is not None) == (mode != "auto")  # a forced call is a grammar
    assert req.echo["tools"] == [
        {"type": "function", "name": "f", "description": None, "parameters": FN["parameters"], "strict": None}
    ]
    assert _parse(tools=[FN], tool_choice="none").gen.tools is None


def test_text_format_is_a_grammar() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = _parse(text={"format": {"type": "json_schema", "name": "s", "schema": schema, "strict": True}})
    assert req.gen.grammar is not None and req.gen.grammar.kind == "json_schema"
    assert req.gen.grammar.param == "text.format.schema"
    assert _parse(text={"format": {"type": "json_object"}}).gen.grammar is not None
    with pytest.raises(ApiError) as exc:
        _parse(text={"format": {"type": "json_object"}}, tools=[FN], tool_choice="required")
    assert exc.value.param == "text.format"


def test_the_store_is_bounded_and_expires() -> None:
    now = [0.0]
    store = ResponseStore(2, 10.0, clock=lambda: now[0])
    for i in range(3):
        store.put(f"r{i}", {"id": f"r{i}"}, [])
    assert store.get("r0") is None and store.get("r1") is not None and len(store) == 2
    now[0] = 10.5
    assert store.get("r1") is None and store.get("r2") is None and len(store) == 0
    store.put("r3", {}, [])
    assert store.delete("r3") and not store.delete("r3")
    empty = ResponseStore(0, 10.0)
    empty.put("x", {}, [])
    assert empty.get("x") is None


def test_a_stored_conversation_knows_its_size() -> None:
    """What a request continuing it parses beyond its own body (off_loop's extra_bytes)."""
    store = ResponseStore(2, 10.0)
    messages = [{"role": "user", "content": "x" * 5000}, {"role": "assistant", "content": "ok"}]
    store.put("r", {}, messages)
    stored = store.get("r")
    assert stored is not None and stored.size == len(orjson.dumps(messages)) > 5000


def test_content_parts_name_the_spot_they_refuse() -> None:
    """Responses' parts (input_text, output_text, refusal) through chat's text_content: a refusal
    counts as text; a part of another type, or one whose text is not a string, names its spot."""
    refused = [{"type": "output_text", "text": "a"}, {"type": "refusal", "refusal": "no"}]
    assert input_messages([{"role": "assistant", "content": refused}]) == [
        {"role": "assistant", "content": "a\nno"}
    ]
    bad = [
        ([{"type": "input_image", "image_url": "x"}], "input[0].content[0]", 400),  # a text model
        ([{"type": "input_text", "text": 3}], "input[0].content[0].text", 400),
        ([{"type": "refusal", "text": "no"}], "input[0].content[0].refusal", 400),
        (["text"], "input[0].content[0]", 400),
    ]
    for content, param, status in bad:
        with pytest.raises(ApiError) as err:
            input_messages([{"role": "user", "content": content}])
        assert (err.value.param, err.value.status) == (param, status), content


@pytest.mark.parametrize("choice", ["sometimes", {"type": "function"}, {"type": "function", "name": "g"}])
def test_bad_tool_choice_is_a_400(choice: Any) -> None:
    with pytest.raises(ApiError) as err:
        _parse(tools=[FN], tool_choice=choice)
    assert (err.value.status, err.value.param) == (400, "tool_choice")
    with pytest.raises(ApiError):
        _parse(tool_choice="required")  # required with no tools
