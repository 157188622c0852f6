"""Structured outputs end to end on the real default model with the `openai` client: every output of
22 JSON schemas parses and validates (streamed and not), Pydantic parsing, n > 1, stop strings,
max_tokens, logprobs and seeds under a grammar, and completions.

Every schema bounds its output (strings by maxLength, enum, pattern or format; integers by bounds;
arrays by maxItems; whitespace at most 38 bytes a gap: core/structured/json_style.py), so a valid
document always fits in MAX_TOKENS whatever the model prefers: the assertions hold on any machine,
not just for this model's greedy choices. Also vLLM's request forms (guided_*, structured_outputs).
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

# minutes on one core: its module is queued first under --dist loadfile (tests/conftest.py)
pytestmark = pytest.mark.slow

MAX_TOKENS = 160
S = {"type": "string", "maxLength": 16}
SMALL = {"type": "integer", "minimum": 0, "maximum": 99}
SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {"type": "object", "properties": {"name": S, "age": SMALL}, "required": ["name", "age"]},
    "nested": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {"name": S, "age": SMALL},
                "required": ["name", "age"],
            },
            "address": {
                "type": "object",
                "properties": {"city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"],
            },
        },
        "required": ["person", "address"],
    },
    "int_array": {
        "type": "array",
        "items": {"type": "integer", "minimum": -10, "maximum": 10},
        "minItems": 2,
        "maxItems": 4,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
    },
    "nullable": {
        "type": "object",
        "properties": {"flag": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 10}},
        "required": ["flag", "note"],
    },
    "refs": {
        "$defs": {
            "point": {"type": "object", "properties": {"x": SMALL, "y": SMALL}, "required": ["x", "y"]}
        },
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"],
    },
    "date": {
        "type": "object",
        "properties": {"when": {"type": "string", "format": "date"}},
        "required": ["when"],
    },
    "uuid": {
        "type": "object",
        "properties": {"id": {"type": "string", "format": "uuid"}},
        "required": ["id"],
    },
    "ipv4": {
        "type": "object",
        "properties": {"host": {"type": "string", "format": "ipv4"}},
        "required": ["host"],
    },
    "pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}},
        "required": ["code"],
    },
    "optional": {
        "type": "object",
        "properties": {"title": S, "subtitle": S, "pages": SMALL},
        "required": ["title"],
    },
    "objects_array": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer", "minimum": 1, "maximum": 100},
                        "kind": {"enum": ["book", "film"]},
                    },
                    "required": ["id", "kind"],
                },
            }
        },
        "required": ["items"],
    },
    "const": {
        "type": "object",
        "properties": {"version": {"const": "v1"}, "count": SMALL},
        "required": ["version", "count"],
    },
    "any_of": {
        "type": "object",
        "properties": {
            "shape": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"kind": {"const": "circle"}, "r": SMALL},
                        "required": ["kind", "r"],
                    },
                    {
                        "type": "object",
                        "properties": {"kind": {"const": "square"}, "side": SMALL},
                        "required": ["kind", "side"],
                    },
                ]
            }
        },
        "required": ["shape"],
    },
    "matrix": {
        "type": "object",
        "properties": {
            "m": {
                "type": "array",
                "minItems": 2,
                "maxItems": 2,
                "items": {
                    "type": "array",
                    "minItems": 2,
                    "maxItems": 2,
                    "items": {"type": "integer", "minimum": 0, "maximum": 9},
                },
            }
        },
        "required": ["m"],
    },
    "lengths": {
        "type": "object",
        "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 8}},
        "required": ["word"],
    },
    "exclusive": {
        "type": "object",
        "properties": {"n": {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 20}},
        "required": ["n"],
    },
    "wide": {
        "type": "object",
        "properties": {
            "a": S,
            "b": SMALL,
            "c": {"type": "boolean"},
            "d": {"enum": [1, 2, 3]},
            "e": {"type": "null"},
            "f": {"type": "array", "items": SMALL, "maxItems": 2},
            "g": {"type": "string", "format": "date"},
            "h": {"type": "integer", "minimum": -5, "maximum": 5},
        },
        "required": ["a", "b", "c", "d", "e", "f", "g", "h"],
    },
    "mixed_enum": {
        "type": "object",
        "properties": {"value": {"enum": [1, "two", True, None]}},
        "required": ["value"],
    },
    "enum_array": {
        "type": "array",
        "items": {"enum": ["north", "south", "east", "west"]},
        "minItems": 1,
        "maxItems": 3,
    },
    "defs_array": {
        "definitions": {"tag": {"type": "string", "pattern": "^#[a-z]{2,6}$"}},
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"$ref": "#/definitions/tag"}, "maxItems": 3}},
        "required": ["tags"],
    },
    "one_of_scalar": {
        "type": "object",
        "properties": {
            "id": {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 999}, {"type": "boolean"}]}
        },
        "required": ["id"],
    },
}
CHECKER = jsonschema.FormatChecker()


def _fmt(name: str) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def _messages(name: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Reply with a JSON document for '{name}'."}]


def _one(client: openai.OpenAI, model: str, name: str, stream: bool) -> tuple[str, str | None]:
    kwargs: dict[str, Any] = {"model": model, "messages": _messages(name), "max_tokens": MAX_TOKENS}
    if stream:  # sampled: other documents than the greedy ones
        chunks = client.chat.completions.create(
            **kwargs, response_format=_fmt(name), stream=True, temperature=0.8, seed=7
        )
        text, finish = "", None
        for chunk in chunks:
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        return text, finish
    r = client.chat.completions.create(**kwargs, response_format=_fmt(name), temperature=0)
    return r.choices[0].message.content or "", r.choices[0].finish_reason


def test_every_schema_output_validates(client: openai.OpenAI, model: str) -> None:
    assert len(SCHEMAS) >= 20
    jobs = [(name, stream) for name in SCHEMAS for stream in (False, True)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda job: _one(client, model, *job), jobs))
    for (name, stream), (text, finish) in zip(jobs, results, strict=True):
        assert finish == "stop", (name, stream, text)
        doc = json.loads(text)
        jsonschema.validate(doc, SCHEMAS[name], format_checker=CHECKER)


class Weather(BaseModel):
    city: str = Field(max_length=20)
    temperature_c: int = Field(ge=-50, le=60)
    sunny: bool


def test_pydantic_parse(client: openai.OpenAI, model: str) -> None:
    r = client.beta.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "The weather in Rome, as JSON."}],
        response_format=Weather,
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Weather) and -50 <= parsed.temperature_c <= 60


def test_json_object_mode(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a cat as a JSON object."}],
        response_format={"type": "json_object"},
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    text = r.choices[0].message.content or ""
    assert text.startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_json_object_is_written_the_way_the_model_writes_json(client: openai.OpenAI, model: str) -> None:
    """Issue 26's prompt: under a compact-only grammar this model wrote `{", ": 10000…` until
    max_tokens; with bounded flexible whitespace it pretty-prints, finishes, and parses."""
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Give three fruits and their colours as JSON."}],
        response_format={"type": "json_object"},
        max_tokens=400,
        temperature=0,
    )
    text = r.choices[0].message.content or ""
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(text), dict), text


def test_n_seed_logprobs_under_a_grammar(client: openai.OpenAI, model: str) -> None:
    def run(seed: int) -> Any:
        return client.chat.completions.create(
            model=model,
            messages=_messages("person"),
            response_format=_fmt("person"),
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            n=2,
            seed=seed,
            logprobs=True,
            top_logprobs=3,
        )

    first, again = run(11), run(11)
    texts = [c.message.content for c in first.choices]
    assert texts == [c.message.content for c in again.choices]  # seeded: reproducible
    for c in first.choices:
        jsonschema.validate(json.loads(c.message.content or ""), SCHEMAS["person"])
        assert c.logprobs is not None and c.logprobs.content
        for entry in c.logprobs.content:  # every sampled token had finite probability after masking
            assert entry.logprob > float("-inf") and entry.top_logprobs


def test_stop_and_max_tokens_cut_the_constrained_output(client: openai.OpenAI, model: str) -> None:
    base = {
        "model": model,
        "messages": _messages("person"),
        "response_format": _fmt("person"),
        "temperature": 0,
    }
    full = client.chat.completions.create(**base, max_tokens=MAX_TOKENS).choices[0].message.content or ""
    assert '"age"' in full
    stopped = client.chat.completions.create(**base, max_tokens=MAX_TOKENS, stop=['"age"'])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == full[: full.index('"age"')]
    short = client.chat.completions.create(**base, max_tokens=3)
    assert short.choices[0].finish_reason == "length"
    assert full.startswith(short.choices[0].message.content or "")


def test_completions_with_response_format(client: openai.OpenAI, model: str) -> None:
    kwargs: dict[str, Any] = {
        "model": model,
        "prompt": "A JSON object describing a person:",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "extra_body": {"response_format": _fmt("person")},
    }
    text = client.completions.create(**kwargs).choices[0].text
    jsonschema.validate(json.loads(text), SCHEMAS["person"])
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(**kwargs, stream=True) if c.choices
    )
    assert streamed == text


@pytest.mark.parametrize(
    ("fmt", "param"),
    [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/missing"}}},
            "response_format.json_schema.schema",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "("}},
            },
            "response_format.json_schema.schema",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}},
            },
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": []}},
            "response_format.json_schema.schema",
        ),
        ({"type": "json_schema", "json_schema": "x"}, "response_format.json_schema"),
        ({"type": "xml"}, "response_format.type"),
    ],
)
def test_bad_schemas_are_400_naming_the_field(
    client: openai.OpenAI, model: str, fmt: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model, messages=_messages("x"), response_format=fmt, max_tokens=4
        )  # type: ignore[arg-type]
    assert err.value.body["param"] == param  # type: ignore[index]


LARK = 'start: "A" ("b" | "c") ("b" | "c")? "!"'
GUIDED: list[tuple[str, dict[str, Any], Any]] = [
    ("guided_choice", {"guided_choice": ["maybe", "perhaps", 'a "quoted" one']}, None),
    ("guided_regex", {"guided_regex": "[0-9]{3}-[a-z]{2}"}, None),
    ("guided_json", {"guided_json": SCHEMAS["person"]}, SCHEMAS["person"]),
    ("guided_json as text", {"guided_json": json.dumps(SCHEMAS["person"])}, SCHEMAS["person"]),
    ("structured_outputs.choice", {"structured_outputs": {"choice": ["yes", "no"]}}, None),
    ("structured_outputs.grammar", {"structured_outputs": {"grammar": LARK}}, None),
    ("structured_outputs.json", {"structured_outputs": {"json": SCHEMAS["person"]}}, SCHEMAS["person"]),
]


@pytest.mark.parametrize(("case", "extra", "schema"), GUIDED, ids=[g[0] for g in GUIDED])
def test_vllm_structured_outputs_hold_the_answer(
    client: openai.OpenAI, model: str, case: str, extra: dict[str, Any], schema: Any
) -> None:
    """vLLM's request forms (http/openai/compat/guided.py) through the same grammar engine: the answer
    matches, streamed and not, in chat and completions."""

    def check(text: str) -> None:
        if case.endswith("choice"):
            assert text in extra.get("guided_choice", extra.get("structured_outputs", {}).get("choice"))
        elif case == "guided_regex":
            assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", text), text
        elif case.endswith("grammar"):
            assert re.fullmatch(r"A[bc]{1,2}!", text), text
        else:
            jsonschema.validate(json.loads(text), schema)

    chat = {"model": model, "messages": _messages("Is the sky blue?"), "max_tokens": MAX_TOKENS}
    r = client.chat.completions.create(**chat, temperature=0, extra_body=extra)
    text = r.choices[0].message.content or ""
    check(text)
    stream = client.chat.completions.create(**chat, temperature=0, extra_body=extra, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
    done = client.completions.create(model=model, prompt="Answer:", max_tokens=MAX_TOKENS, extra_body=extra)
    check(done.choices[0].text)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_regex": "("}, "guided_regex"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_grammar": "start: undefined_rule"}, "guided_grammar"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
        ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
    ],
)
def test_bad_vllm_structured_outputs_are_400_naming_the_field(
    client: openai.OpenAI, model: str, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=_messages("x"), max_tokens=4, extra_body=extra)
    assert err.value.body["param"] == param  # type: ignore[index]
