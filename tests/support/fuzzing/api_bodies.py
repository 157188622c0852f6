"""Hypothesis strategies for hostile /v1/responses and /v1/messages request bodies, over the fields
of OpenAI's Responses API and Anthropic's Messages API: the same two families as
fuzzing/chat_bodies.py, random JSON of random shapes (plus bytes that are not JSON at all), and "almost
valid" bodies, a valid request with a few fields replaced by values of the wrong type, out of range,
at a boundary, or of a strange shape.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import strategies as st

from fuzzing.values import NASTY_TEXT, RAW_NUMBERS, any_json, hostile_schema, text

RESPONSES_FIELDS = [
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "stream",
    "store",
    "previous_response_id",
    "metadata",
    "reasoning",
    "include",
    "truncation",
    "background",
    "conversation",
    "top_logprobs",
    "seed",
    "stop",
    "top_k",
    "logit_bias",
]
MESSAGES_FIELDS = [
    "model",
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "metadata",
    "stream",
    "tools",
    "tool_choice",
    "thinking",
    "output_config",
    "container",
]

_part = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["input_text", "output_text", "text", "refusal", "input_image", "x"])
        | any_json
    },
    optional={"text": text | any_json, "refusal": text},
)
_item = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(
            ["message", "function_call", "function_call_output", "reasoning", "item_reference"]
        )
        | any_json,
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool", ""]) | any_json,
        "content": text | st.lists(_part, max_size=3) | any_json,
        "call_id": st.sampled_from(["c1", "call_x"]) | any_json,
        "name": st.sampled_from(["f", "bad name"]) | any_json,
        "arguments": st.sampled_from(["{}", '{"a": 1}', "{not json"]) | any_json,
        "output": text | st.lists(_part, max_size=2) | any_json,
    },
)
_block = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "tool_result", "image", "thinking", "x"]) | any_json},
    optional={
        "text": text | any_json,
        "id": st.sampled_from(["toolu_1", ""]) | any_json,
        "name": st.sampled_from(["f", "bad name"]) | any_json,
        "input": st.dictionaries(st.text(max_size=4), any_json, max_size=2) | any_json,
        "tool_use_id": st.sampled_from(["toolu_1"]) | any_json,
        "content": text
        | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2)
        | any_json,
        "is_error": st.booleans() | any_json,
    },
)
_a_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", ""]) | any_json},
    optional={"content": text | st.lists(_block, max_size=3) | any_json},
)
_function = {
    "type": "function",
    "name": "f",
    "parameters": {"type": "object", "properties": {"a": {"enum": [1, 2]}}},
}
_custom = {"name": "f", "input_schema": {"type": "object", "properties": {"a": {"enum": [1, 2]}}}}

_API_WILD: dict[str, st.SearchStrategy[Any]] = {
    "input": text | st.lists(_item, max_size=4),
    "messages": st.lists(_a_message, max_size=4),
    "system": text
    | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text | any_json}), max_size=2),
    "text": st.fixed_dictionaries(
        {},
        optional={
            "format": st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "json_object", "json_schema", "xml"]) | any_json},
                optional={"schema": hostile_schema | any_json, "name": text | any_json, "strict": any_json},
            )
            | any_json,
            "verbosity": any_json,
        },
    ),
    "output_config": st.fixed_dictionaries(
        {},
        optional={
            "format": st.fixed_dictionaries(
                {"type": st.sampled_from(["json_schema", "x"])},
                optional={"schema": hostile_schema | any_json},
            )
            | any_json,
            "effort": any_json,
        },
    ),
    "tools": st.lists(
        st.sampled_from(
            [_function, _custom, {"type": "web_search"}, {"type": "function", "name": "bad name"}]
        )
        | st.dictionaries(
            st.sampled_from(["type", "name", "parameters", "input_schema"]), any_json, max_size=4
        ),
        max_size=3,
    ),
    "tool_choice": st.sampled_from(
        [
            "none",
            "auto",
            "required",
            {"type": "function", "name": "f"},
            {"type": "any"},
            {"type": "tool", "name": "f"},
        ]
    )
    | any_json,
    "stop_sequences": st.lists(text, max_size=4) | any_json,
    "logit_bias": st.dictionaries(st.text(max_size=6), any_json, max_size=3),
    "include": st.lists(
        st.sampled_from(["reasoning.encrypted_content", "message.output_text.logprobs", "x"])
    ),
    "previous_response_id": st.sampled_from(["resp_nope", ""]) | any_json,
    "model": st.sampled_from(["synthetic", "gpt-4", "claude-3", ""]) | any_json,
}
_API_VALID: dict[str, st.SearchStrategy[Any]] = {
    "max_output_tokens": st.integers(1, 8),
    "max_tokens": st.integers(1, 8),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 100),
    "seed": st.integers(0, 2**32),
    "stream": st.booleans(),
    "store": st.booleans(),
    "stop": st.text(min_size=1, max_size=5),
    "stop_sequences": st.lists(st.text(min_size=1, max_size=5), max_size=3),
    "logit_bias": st.dictionaries(st.integers(0, 49151).map(str), st.floats(-100, 100), max_size=3),
    "tools": st.just([_function]),
    "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function", "name": "f"}]),
    "metadata": st.just({"k": "v"}),
    "reasoning": st.just({"effort": "low"}),
    "include": st.just([]),
    "thinking": st.just({"type": "disabled"}),
}
_MESSAGES_VALID = {
    "tools": st.just([_custom]),
    "tool_choice": st.sampled_from([{"type": "auto"}, {"type": "any"}]),
}


def _api_values(name: str, api: str) -> st.SearchStrategy[Any]:
    valid = _MESSAGES_VALID.get(name) if api == "messages" else None
    if valid is None:
        valid = _API_VALID.get(name)
    wild = (
        _API_WILD.get(name, st.sampled_from(NASTY_TEXT) | st.integers(-10, 300) | st.floats(-3, 3)) | any_json
    )
    if valid is None:
        return wild
    return st.integers(0, 9).flatmap(lambda k: valid if k < 6 else wild)


def valid_api_body(api: str, model: str) -> dict[str, Any]:
    if api == "responses":
        return {"model": model, "input": "Hello there", "max_output_tokens": 4}
    return {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "Hello there"}]}


@st.composite
def random_api_body(draw: st.DrawFn, api: str) -> bytes:
    fields = RESPONSES_FIELDS if api == "responses" else MESSAGES_FIELDS
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return orjson.dumps(draw(any_json))
    if choice == 1:
        return orjson.dumps(
            draw(st.dictionaries(st.sampled_from(fields) | st.text(max_size=10), any_json, max_size=8))
        )
    if choice == 2:
        return draw(st.binary(max_size=300))
    name = draw(st.sampled_from(fields))
    return b'{"model": "synthetic", "%s": %s}' % (name.encode(), draw(st.sampled_from(RAW_NUMBERS)).encode())


@st.composite
def almost_valid_api_body(draw: st.DrawFn, api: str, model: str) -> bytes:
    body = valid_api_body(api, model)
    fields = RESPONSES_FIELDS if api == "responses" else MESSAGES_FIELDS
    for name in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=5, unique=True)):
        body[name] = draw(_api_values(name, api))
    for name in draw(st.lists(st.sampled_from(sorted(body)), max_size=1)):
        if draw(st.integers(0, 3)) == 0:
            body.pop(name, None)
    return orjson.dumps(body)
