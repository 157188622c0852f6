"""Hypothesis strategies for hostile request bodies, and the checks every answer must pass.

Two families per endpoint: random JSON of random shapes (plus bytes that are not JSON at all), and
"almost valid" bodies, a valid request with a few fields replaced by values of the wrong type, out
of range, at a boundary, or of a strange shape. The checks: never a 5xx; every 4xx in the API's
error shape (OpenAI's, Anthropic's on /v1/messages); every 200 a well-formed answer (or an SSE
stream that ends as its API ends one, with no error event). Chat and completions first, then
/v1/responses and /v1/messages. Shared by tests/reliability/test_fuzz_bodies.py and
bench/stress/fuzz_bodies.py.
"""

from __future__ import annotations

import base64
import http.client
import math
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from rel_helpers import CHAT, is_openai_error

# Hypothesis' caches (unicode tables, constants) go to /tmp, never into the repository.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "rillet-hypothesis")

# Values a parser must never trip over; also text the chat template and tokenizer see raw.
NASTY_TEXT = [
    "",
    " ",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "{{ raise_exception('x') }}",
    "{% for x in range(10**9) %}{% endfor %}",
    "\x00",
    "\u202e\u200b\ufeff",
    "😀" * 50,
    "a" * 3000,
    "../../../../etc/passwd",
    "/etc/passwd",
    "file:///etc/passwd",
    "%s%n%x",
]
NASTY_NUMBERS: list[Any] = [
    0,
    -1,
    1,
    2,
    7,
    8,
    9,
    255,
    256,
    49151,
    49152,
    2**31 - 1,
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    -(2**63),
    0.0,
    -0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    100.0,
    100.5,
    1e-300,
    5e-324,
    1e300,
    -1e300,
    True,
    False,
]
# Spliced into the JSON text: values orjson would not produce from Python (overflow, big ints).
RAW_NUMBERS = ["1e400", "-1e400", "18446744073709551616", "-9223372036854775809", "1E2", "-0", "1.0e0"]

COMMON_FIELDS = [
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stream",
    "stream_options",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
    "user",
    "logit_bias",
    "response_format",
    "tools",
    "tool_choice",
    "best_of",
    "include_stop_str_in_output",
]
CHAT_FIELDS = [
    *COMMON_FIELDS,
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "modalities",
    "parallel_tool_calls",
]
COMPLETION_FIELDS = [*COMMON_FIELDS, "prompt", "echo", "logprobs", "suffix"]
EMBEDDING_FIELDS = ["model", "input", "encoding_format", "dimensions", "truncate_prompt_tokens", "user"]
EMB = "/v1/embeddings"
_FIELDS = {"chat": CHAT_FIELDS, "completion": COMPLETION_FIELDS, "embeddings": EMBEDDING_FIELDS}

leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
    | st.sampled_from(NASTY_TEXT)
    | st.sampled_from(NASTY_NUMBERS)
)
any_json = st.recursive(
    leaf,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=25,
)
text = st.text(max_size=60) | st.sampled_from(NASTY_TEXT)
token_id = st.integers(min_value=-5, max_value=49160) | st.sampled_from(NASTY_NUMBERS)

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


# JSON Schemas a grammar compiler must refuse (or bound) without a crash or a stall: bad types, bad
# or cyclic $refs, bad and explosive regexes, huge and negative bounds, unimplemented keywords.
_SCHEMA_LEAF = st.sampled_from(
    [
        {},
        {"type": "string", "maxLength": 8},
        {"type": "integer", "minimum": 0, "maximum": 9},
        {"type": "nope"},
        {"type": []},
        {"type": "string", "pattern": "("},
        {"type": "string", "pattern": "[z-a]"},
        {"type": "string", "pattern": "(a+)+$"},
        {"type": "string", "pattern": "(a|aa){1000}"},
        {"type": "string", "pattern": "\\p{Nope}"},
        {"type": "string", "minLength": 10**9},
        {"type": "string", "maxLength": -1},
        {"type": "string", "format": "nope"},
        {"type": "string", "format": "email"},
        {"type": "integer", "minimum": 10**30},
        {"type": "integer", "minimum": 5, "maximum": 1},
        {"type": "array", "minItems": 2**63},
        {"type": "array", "minItems": 3, "maxItems": 1},
        {"type": "array", "uniqueItems": True},
        {"$ref": "#/nope"},
        {"$ref": "http://example.invalid/schema"},
        {"$ref": "#"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {"not": {}},
        {"enum": []},
        {"const": None},
        {"minimum": True},
        {"anyOf": []},
    ]
)
hostile_schema = st.recursive(
    _SCHEMA_LEAF
    | st.dictionaries(st.sampled_from(["type", "properties", "items", "$ref", "enum"]), any_json, max_size=3),
    lambda inner: st.fixed_dictionaries(
        {"type": st.sampled_from(["object", "array"])},
        optional={
            "properties": st.dictionaries(st.text(max_size=6), inner, max_size=3),
            "required": st.lists(st.text(max_size=6), max_size=3) | any_json,
            "items": inner,
            "anyOf": st.lists(inner, max_size=3),
            "$defs": st.dictionaries(st.sampled_from(["a", "b"]), inner, max_size=2),
            "additionalProperties": st.booleans() | inner,
        },
    ),
    max_leaves=12,
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


class Client:
    """One keep-alive connection to the server; reconnects when the server closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.conn: http.client.HTTPConnection | None = None
        self.statuses: Counter[int] = Counter()
        self.cases = 0

    def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            try:
                self.conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                r = self.conn.getresponse()
                data = r.read()
                headers = {k.lower(): v for k, v in r.getheaders()}
                if r.will_close:
                    self.close()
                return r.status, headers, data
            except (ConnectionError, http.client.RemoteDisconnected, http.client.CannotSendRequest):
                self.close()  # a keep-alive connection the server had closed: once more, fresh
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def check(self, path: str, body: bytes) -> None:
        """Sends one body; asserts the answer is a legal one."""
        if path in (RESPONSES, MESSAGES):
            self.check_api(path, body)
            return
        status, headers, data = self.post(path, body)
        self.cases += 1
        self.statuses[status] += 1
        context = f"{path} {body[:300]!r} -> {status} {data[:500]!r}"
        assert status < 500, context
        if status >= 400:
            assert headers.get("content-type", "").startswith("application/json"), context
            assert is_openai_error(orjson.loads(data)), context
            return
        assert status == 200, context
        if headers.get("content-type", "").startswith("text/event-stream"):
            check_sse(data, context)
        elif path == EMB:
            check_embeddings(orjson.loads(data), context)
        else:
            check_completion(orjson.loads(data), path == CHAT, context)

    def check_api(self, path: str, body: bytes) -> None:
        """/v1/responses and /v1/messages: answers in their APIs' shapes."""
        status, headers, data = self.post(path, body)
        self.cases += 1
        self.statuses[status] += 1
        context = f"{path} {body[:300]!r} -> {status} {data[:500]!r}"
        assert status < 500, context
        if status >= 400:
            assert headers.get("content-type", "").startswith("application/json"), context
            error = orjson.loads(data)
            assert (is_anthropic_error if path == MESSAGES else is_openai_error)(error), context
            return
        assert status == 200, context
        if headers.get("content-type", "").startswith("text/event-stream"):
            events = _named_events(data, context)
            if path == RESPONSES:
                _check_response_events(events, context)
            else:
                _check_message_events(events, context)
        elif path == RESPONSES:
            _check_response(orjson.loads(data), context)
        else:
            _check_message(orjson.loads(data), context)


def check_completion(body: Any, chat: bool, context: str) -> None:
    assert body["object"] == ("chat.completion" if chat else "text_completion"), context
    assert body["choices"], context
    for i, c in enumerate(body["choices"]):
        assert c["index"] == i and c["finish_reason"] in ("stop", "length"), context
        content = c["message"]["content"] if chat else c["text"]
        assert isinstance(content, str), context
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], context


def check_embeddings(body: Any, context: str) -> None:
    assert body["object"] == "list" and body["data"], context
    sizes = set()
    for i, d in enumerate(body["data"]):
        assert d["object"] == "embedding" and d["index"] == i, context
        e = d["embedding"]
        if isinstance(e, str):  # base64 of little-endian float32
            raw = base64.b64decode(e, validate=True)
            assert raw and len(raw) % 4 == 0, context
            sizes.add(len(raw) // 4)
        else:
            assert e and all(isinstance(x, float) and math.isfinite(x) for x in e), context
            sizes.add(len(e))
    assert len(sizes) == 1, context  # one size for every input of a request
    usage = body["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0, context


def check_sse(data: bytes, context: str) -> None:
    blocks = [b for b in data.split(b"\n\n") if b.strip()]
    assert blocks and blocks[-1] == b"data: [DONE]", context
    finished = set()
    for block in blocks[:-1]:
        assert block.startswith(b"data: "), context
        event = orjson.loads(block[6:])
        assert "error" not in event, context
        for c in event["choices"]:
            if c["finish_reason"] is not None:
                assert c["finish_reason"] in ("stop", "length"), context
                finished.add(c["index"])
    assert finished, context


# ---- /v1/responses and /v1/messages ---------------------------------------------------------------

RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"

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


def is_anthropic_error(body: Any) -> bool:
    if not isinstance(body, dict) or set(body) != {"type", "error"} or body["type"] != "error":
        return False
    err = body["error"]
    return (
        isinstance(err, dict)
        and set(err) == {"type", "message"}
        and isinstance(err["type"], str)
        and isinstance(err["message"], str)
        and bool(err["message"])
    )


def _named_events(data: bytes, context: str) -> list[tuple[str, Any]]:
    out = []
    for block in data.split(b"\n\n"):
        if not block.strip():
            continue
        head, _, payload = block.partition(b"\ndata: ")
        assert head.startswith(b"event: ") and payload, context
        event = orjson.loads(payload)
        assert event["type"] == head[7:].decode(), context
        out.append((event["type"], event))
    return out


def _check_response(r: Any, context: str) -> None:
    assert r["object"] == "response" and r["status"] in ("completed", "incomplete"), context
    assert r["output"] and all(o["type"] in ("message", "function_call") for o in r["output"]), context
    usage = r["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"], context


def _check_response_events(events: list[tuple[str, Any]], context: str) -> None:
    kinds = [k for k, _ in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], context
    assert kinds[-1] in ("response.completed", "response.incomplete"), context
    assert "error" not in kinds and "response.failed" not in kinds, context
    assert [e["sequence_number"] for _, e in events] == list(range(len(events))), context
    _check_response(events[-1][1]["response"], context)


def _check_message(m: Any, context: str) -> None:
    assert m["type"] == "message" and m["role"] == "assistant" and m["content"], context
    assert m["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence", "tool_use"), context
    assert all(b["type"] in ("text", "tool_use") for b in m["content"]), context


def _check_message_events(events: list[tuple[str, Any]], context: str) -> None:
    kinds = [k for k, _ in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], context
    assert "error" not in kinds, context
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") >= 1, context
