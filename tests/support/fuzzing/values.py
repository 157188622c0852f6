"""Shared values for fuzzing the endpoints with hostile request bodies: values a parser must never
trip over, the field lists of chat, completions and embeddings requests, the endpoints' paths, and
the basic Hypothesis strategies (random JSON of random shapes, text, token ids, hostile JSON Schemas)
that fuzzing/chat_bodies.py and fuzzing/api_bodies.py build on. Importing it sends Hypothesis' caches to
/tmp before any strategy is used. Shared by tests/reliability/test_fuzz_bodies.py and
bench/stress/fuzz_bodies.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

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
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"

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
