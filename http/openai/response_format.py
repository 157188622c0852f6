"""`response_format` -> a grammar spec, or a 400 naming the field. Shapes only: the engine compiles
the grammar (core/structured/), and a schema it cannot compile is a 400 from there (grammar_prep.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rillet.core.structured.spec import GrammarSpec
from rillet.http.openai.errors import bad_request
from rillet.http.openai.fields import Body, type_name

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # a schema's or a function's name


def parse_response_format(body: Body) -> GrammarSpec | None:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad_request(
            f"'response_format' must be an object, got {type_name(fmt)}",
            param="response_format",
            code="invalid_type",
        )
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object", param="response_format")
    if kind != "json_schema":
        raise bad_request(
            f"'response_format.type' must be one of text, json_object, json_schema, got {kind!r}",
            param="response_format.type",
        )
    where = "response_format.json_schema"
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request(f"'{where}' must be an object, got {type_name(spec)}", param=where)
    return json_schema_spec(spec, where)


def json_schema_spec(spec: dict[str, Any], where: str) -> GrammarSpec:
    """`{"name", "strict", "schema", ...}` at `where`: chat's `response_format.json_schema`, or the
    Responses API's flat `text.format`."""
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not NAME.match(name)):
        raise bad_request(
            f"'{where}.name' must be a string of letters, digits, '_', '-' or '.' (at most 64)",
            param=f"{where}.name",
        )
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(f"'{where}.strict' must be a boolean", param=f"{where}.strict")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise bad_request(
            f"'{where}.schema' must be a JSON Schema object, got {type_name(schema)}", param=f"{where}.schema"
        )
    return GrammarSpec("json_schema", schema_text(schema, f"{where}.schema"), param=f"{where}.schema")


def schema_text(schema: dict[str, Any], where: str) -> str:
    try:
        return json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, RecursionError) as exc:
        raise bad_request(f"'{where}' is not valid JSON: {exc}", param=where) from exc
