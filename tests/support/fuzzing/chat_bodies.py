"""Hypothesis strategies for hostile /v1/chat/completions, /v1/completions and /v1/embeddings
request bodies. Two families per endpoint: random JSON of random shapes (plus bytes that are not
JSON at all), and "almost valid" bodies, a valid request with a few fields replaced by values of the
wrong type, out of range, at a boundary, or of a strange shape; also valid bodies whose sampling
parameters are all in range (sampling_body) and valid embeddings requests (embedding_body).
/v1/responses and /v1/messages: fuzzing/api_bodies.py.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import strategies as st

from fuzzing.values import (
    CHAT_FIELDS,
    COMMON_FIELDS,
    COMPLETION_FIELDS,
    EMBEDDING_FIELDS,
    NASTY_NUMBERS,
    RAW_NUMBERS,
    any_json,
    hostile_schema,
    text,
    token_id,
)

_FIELDS = {"chat": CHAT_FIELDS, "completion": COMPLETION_FIELDS, "embeddings": EMBEDDING_FIELDS}

_content_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "input_audio", "refusal", "x"])},
    optional={"text": text | any_json, "image_url": any_json},
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "developer", "tool", "wizard", ""]) | any_json},
    optional={
        "content": text | st.lists(_content_part, max_size=3) | any_json,
        "name": text | any_json,
        "tool_calls": any_json,
    },
)


_json_schema_format = st.fixed_dictionaries(
    {"type": st.just("json_schema")},
    optional={
        "json_schema": st.fixed_dictionaries(
            {"schema": hostile_schema | any_json},
            optional={"name": text | any_json, "strict": st.booleans() | any_json},
        )
        | any_json
    },
)
_tool = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "retrieval"]) | any_json},
    optional={
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["f", "get_weather", "bad name!", "", "x" * 80]) | text | any_json},
            optional={"parameters": hostile_schema | any_json, "description": text | any_json},
        )
        | any_json
    },
)
_tool_choice = st.sampled_from(
    [
        "none",
        "auto",
        "required",
        "sometimes",
        {"type": "function", "function": {"name": "f"}},
        {"type": "function"},
    ]
)


def _wild_values(name: str) -> st.SearchStrategy[Any]:
    """Plausible-but-wrong values for one field, mixed with anything at all."""
    specific: dict[str, st.SearchStrategy[Any]] = {
        "messages": st.lists(_message, max_size=4),
        "prompt": text
        | st.lists(text, max_size=4)
        | st.lists(token_id, max_size=12)
        | st.lists(st.lists(token_id, max_size=6), max_size=3),
        "stop": text | st.lists(text, max_size=5),
        "stop_token_ids": st.lists(token_id, max_size=5),
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": any_json}),
        "response_format": st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "json_object"]) | any_json}
        )
        | _json_schema_format,
        "tools": st.lists(_tool, max_size=3),
        "tool_choice": _tool_choice,
        "logit_bias": st.dictionaries(st.text(max_size=6), any_json, max_size=3),
        "model": st.sampled_from(["synthetic", "gpt-4", "/etc/passwd", "../synthetic", ""]) | any_json,
        "input": text
        | st.lists(text, max_size=4)
        | st.lists(token_id, max_size=12)
        | st.lists(st.lists(token_id, max_size=6), max_size=3),
        "encoding_format": st.sampled_from(["float", "base64", "hex", "", "FLOAT"]) | any_json,
    }
    numeric = st.sampled_from(NASTY_NUMBERS) | st.integers(-10, 300) | st.floats(-3, 3)
    return specific.get(name, numeric) | any_json


_good_text = st.text(min_size=1, max_size=30)
VALID_TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"enum": [1, 2]}}}},
    }
]
_ids = st.lists(st.integers(0, 49151), min_size=1, max_size=20)
# In-range values, so that mutated bodies often pass validation and reach the engine.
_VALID: dict[str, st.SearchStrategy[Any]] = {
    "max_tokens": st.integers(1, 8),
    "max_completion_tokens": st.integers(1, 8),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 100),
    "min_p": st.floats(0, 1),
    "n": st.integers(1, 4),
    "seed": st.integers(-(2**63), 2**64 - 1),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.01, 10),
    "min_tokens": st.integers(0, 4),
    "stop": _good_text | st.lists(_good_text, max_size=4),
    "stop_token_ids": st.lists(st.integers(0, 49151), max_size=4),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "ignore_eos": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "user": st.text(max_size=20),
    "echo": st.booleans(),
    "logprobs": st.booleans() | st.integers(0, 20),
    "top_logprobs": st.integers(0, 20),
    "response_format": st.sampled_from(
        [
            {"type": "text"},
            {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"name": "s", "schema": {"enum": ["a", "b"]}}},
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "p",
                    "schema": {
                        "type": "object",
                        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                    },
                },
            },
        ]
    ),
    "logit_bias": st.just({}),
    "tools": st.just([]) | st.just(VALID_TOOLS),
    "tool_choice": st.sampled_from(
        ["none", "auto", "required", {"type": "function", "function": {"name": "f"}}]
    ),
    "parallel_tool_calls": st.booleans(),
    "modalities": st.just(["text"]),
    "messages": st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["system", "user", "assistant", "developer", "tool"]), "content": text}
        ),
        min_size=1,
        max_size=4,
    ),
    "prompt": text
    | st.lists(_good_text, min_size=1, max_size=3)
    | _ids
    | st.lists(_ids, min_size=1, max_size=3),
    "input": _good_text
    | st.lists(_good_text, min_size=1, max_size=4)
    | _ids
    | st.lists(_ids, min_size=1, max_size=3),
    "encoding_format": st.sampled_from(["float", "base64"]),
    "dimensions": st.integers(1, 64),
    "truncate_prompt_tokens": st.integers(-1, 300),
}


def _field_values(name: str) -> st.SearchStrategy[Any]:
    valid = _VALID.get(name)
    if valid is None:
        return _wild_values(name)
    return st.integers(0, 9).flatmap(lambda k: valid if k < 6 else _wild_values(name))


@st.composite
def random_body(draw: st.DrawFn, kind: str) -> bytes:
    """Anything: random JSON, a random object over the endpoint's field names, or not JSON."""
    fields = _FIELDS[kind]
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return orjson.dumps(draw(any_json))
    if choice == 1:
        keys = st.sampled_from(fields) | st.text(max_size=10)
        return orjson.dumps(draw(st.dictionaries(keys, any_json, max_size=8)))
    if choice == 2:
        return draw(st.binary(max_size=300))
    # JSON text with a number no Python value serialises to
    name = draw(st.sampled_from(fields))
    return b'{"model": "synthetic", "%s": %s}' % (name.encode(), draw(st.sampled_from(RAW_NUMBERS)).encode())


def valid_body(kind: str, model: str) -> dict[str, Any]:
    if kind == "embeddings":
        return {"model": model, "input": ["Hello there", "General Kenobi"]}
    if kind == "chat":
        return {"model": model, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4}
    return {"model": model, "prompt": "Once upon a time", "max_tokens": 4}


@st.composite
def almost_valid_body(draw: st.DrawFn, kind: str, model: str) -> bytes:
    """A valid request with some fields replaced, added or removed."""
    body = valid_body(kind, model)
    fields = _FIELDS[kind]
    for name in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=5, unique=True)):
        body[name] = draw(_field_values(name))
    for name in draw(st.lists(st.sampled_from(sorted(body)), max_size=1)):
        if draw(st.integers(0, 3)) == 0:
            body.pop(name, None)
    raw = orjson.dumps(body)
    if draw(st.integers(0, 9)) == 0:  # splice an unrepresentable number into one field
        name = draw(st.sampled_from(fields))
        raw = raw[:-1] + b',"%s":%s}' % (name.encode(), draw(st.sampled_from(RAW_NUMBERS)).encode())
    return raw


# COMMON_FIELDS from max_tokens up to stop_token_ids: the parameters the sampler and stop checks read
SAMPLING_FIELDS = [f for f in COMMON_FIELDS[1 : COMMON_FIELDS.index("user")] if f != "stream_options"]


@st.composite
def sampling_body(draw: st.DrawFn, kind: str, model: str) -> bytes:
    """A valid request whose sampling parameters are all drawn from their valid ranges: the bodies
    that must reach the sampler (almost_valid_body mostly tests the 400 paths)."""
    body = valid_body(kind, model)
    for name in draw(st.lists(st.sampled_from(SAMPLING_FIELDS), min_size=1, max_size=6, unique=True)):
        body[name] = draw(_VALID[name])
    if kind == "chat" and draw(st.booleans()):
        body["logprobs"], body["top_logprobs"] = True, draw(st.integers(0, 20))
    return orjson.dumps(body)


@st.composite
def embedding_body(draw: st.DrawFn, model: str, vocab_size: int, size: int, max_len: int) -> bytes:
    """A valid /v1/embeddings request for a model of `vocab_size` ids, `size` components and inputs
    of at most `max_len` tokens (over-long ones are asked to be truncated)."""
    ids = st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=2 * max_len)
    inputs = draw(st.lists(_good_text, min_size=1, max_size=6) | st.lists(ids, min_size=1, max_size=6))
    body: dict[str, Any] = {"model": model, "input": inputs, "truncate_prompt_tokens": -1}
    if draw(st.booleans()):
        body["dimensions"] = draw(st.integers(1, size))
    if draw(st.booleans()):
        body["truncate_prompt_tokens"] = draw(st.integers(1, max_len))
    body["encoding_format"] = draw(st.sampled_from(["float", "base64"]))
    return orjson.dumps(body)
