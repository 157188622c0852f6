"""JSON Schema as constrained decoding should read it: objects closed unless they say otherwise.

JSON Schema lets an object hold properties it does not list; OpenAI's strict mode forbids them, and
so do xgrammar (vLLM, SGLang) by default. A grammar that allows them lets a small model wander off
into invented keys until max_tokens, so every object schema that lists `properties` and says nothing
about other keys gets `"additionalProperties": false`. Schemas under `allOf` are left alone (closing
each part would reject the combination), as are objects that set any of the keywords below.
"""

from __future__ import annotations

from typing import Any

_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def close_objects(schema: Any, depth: int = 0) -> Any:
    """A copy of `schema` with listed-property objects closed (the input is not changed)."""
    if not isinstance(schema, dict) or depth > 64:
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        value = out.get(key)
        if isinstance(value, dict):
            out[key] = {k: close_objects(v, depth + 1) for k, v in value.items()}
    for key in _SUBSCHEMA_LISTS:
        value = out.get(key)
        if isinstance(value, list):
            out[key] = [close_objects(v, depth + 1) for v in value]
    for key in _SUBSCHEMA_ONE:
        if key in out:
            out[key] = close_objects(out[key], depth + 1)
    if (
        isinstance(out.get("properties"), dict)
        and "allOf" not in out
        and not any(k in out for k in _OPEN_KEYS)
    ):
        out["additionalProperties"] = False
    return out
