"""vLLM's structured-output extensions of chat and completions, for clients written against it:
`guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, and their newer form
`structured_outputs: {json | regex | choice | grammar | json_object}` -> a GrammarSpec, or None.

The output is held to it by the same grammar engine as `response_format` (llguidance):
- json: a JSON Schema (an object, or a string holding one);
- regex: a regular expression the whole output matches;
- choice: exactly one of the given strings;
- grammar: a Lark grammar in llguidance's dialect (vLLM's `guidance` backend takes the same);
- json_object: true, any JSON object.
One constraint a request: two of these, or one with `response_format` (other than text), is a 400.
vLLM's other `structured_outputs` keys (whitespace and fallback switches, structural tags) are
refused by name rather than ignored.
"""

from __future__ import annotations

import json
from typing import Any

from rillet.core.structured.spec import GrammarSpec
from rillet.http.openai.errors import bad_request, unsupported
from rillet.http.openai.fields import Body, type_name
from rillet.http.openai.response_format import schema_text

_LEGACY = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
_KINDS = ("json", "regex", "choice", "grammar", "json_object")


def parse_guided(body: Body) -> GrammarSpec | None:
    found = [(name, body[name], kind) for name, kind in _LEGACY.items() if body.get(name) is not None]
    found += _structured_outputs(body.get("structured_outputs"))
    if len(found) > 1:
        names = ", ".join(f"'{name}'" for name, _, _ in found)
        raise bad_request(f"{names}: give one output constraint, not several", param=found[1][0])
    if not found:
        return None
    name, value, kind = found[0]
    return _spec(name, value, kind)


def _structured_outputs(value: Any) -> list[tuple[str, Any, str]]:
    if value is None:
        return []
    if not isinstance(value, dict):
        raise bad_request(
            f"'structured_outputs' must be an object, got {type_name(value)}",
            param="structured_outputs",
            code="invalid_type",
        )
    for key in value:
        if key not in _KINDS and value[key] not in (None, False):
            raise unsupported(f"structured_outputs.{key}")
    return [(f"structured_outputs.{k}", value[k], k) for k in _KINDS if value.get(k) not in (None, False)]


def _spec(name: str, value: Any, kind: str) -> GrammarSpec:
    if kind == "json_object":
        if value is not True:
            raise bad_request(f"'{name}' must be true", param=name)
        return GrammarSpec("json_object", param=name)
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise bad_request(f"'{name}' is not valid JSON: {exc}", param=name) from exc
        if not isinstance(value, dict):
            raise bad_request(f"'{name}' must be a JSON Schema object, got {type_name(value)}", param=name)
        return GrammarSpec("json_schema", schema_text(value, name), param=name)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad_request(f"'{name}' must be a non-empty array of non-empty strings", param=name)
        literals = " | ".join(json.dumps(c, ensure_ascii=False) for c in value)  # Lark takes JSON's escapes
        return GrammarSpec("lark", "start: " + literals, param=name)
    if not isinstance(value, str) or not value:
        raise bad_request(f"'{name}' must be a non-empty string, got {type_name(value)}", param=name)
    return GrammarSpec("regex" if kind == "regex" else "lark", value, param=name)
