"""Responses `text.format` -> a grammar spec (as chat's `response_format`), or a 400 naming the field.

`{"type": "text"}` (none), `{"type": "json_object"}`, `{"type": "json_schema", "name", "schema",
"strict", "description"}` (flat, unlike chat's `json_schema` wrapper). `text.verbosity` is accepted
and ignored: the model has one way of answering.
"""

from __future__ import annotations

from rillet.core.structured.spec import GrammarSpec
from rillet.http.openai.errors import bad_request
from rillet.http.openai.fields import Body, opt_dict, type_name
from rillet.http.openai.response_format import json_schema_spec


def parse_text_format(body: Body) -> GrammarSpec | None:
    text = opt_dict(body, "text")
    if text is None:
        return None
    fmt = text.get("format")
    if fmt is None:
        return None
    where = "text.format"
    if not isinstance(fmt, dict):
        raise bad_request(f"'{where}' must be an object, got {type_name(fmt)}", param=where)
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object", param=where)
    if kind != "json_schema":
        raise bad_request(
            f"'{where}.type' must be one of text, json_object, json_schema, got {kind!r}",
            param=f"{where}.type",
        )
    return json_schema_spec(fmt, where)
