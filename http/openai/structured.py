"""`response_format`, `tools`, `tool_choice` and `parallel_tool_calls` -> a grammar spec and a tool
setup, or a 400 naming the field. Shapes only: the engine compiles the grammar (core/structured/),
and a schema it cannot compile is a 400 from there (handlers.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from rillet.core.structured.schema import close_objects
from rillet.core.structured.spec import GrammarSpec
from rillet.http.openai.errors import bad_request
from rillet.http.openai.fields import Body, opt_bool, type_name

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
# JSON inside forced tool calls: compact, one line (as core/structured/compiler.py's JSON_OPTIONS).
_X_GUIDANCE = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}

ToolMode = Literal["auto", "required", "named"]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """The definition as OpenAI's API (and chat templates that render tools) spell it."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = self.parameters
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolSetup:
    tools: tuple[Tool, ...]
    mode: ToolMode
    named: str | None  # the forced function when mode == "named"
    parallel: bool

    def grammar(self) -> GrammarSpec | None:
        """`required` / named: a Lark grammar of one or more `<tool_call>` blocks whose JSON has the
        chosen function's name and arguments valid for its parameters; `auto`: none (free text)."""
        if self.mode == "auto":
            return None
        chosen = [t for t in self.tools if self.mode == "required" or t.name == self.named]
        variants = [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": close_objects(t.parameters)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in chosen
        ]
        schema: dict[str, Any] = variants[0] if len(variants) == 1 else {"anyOf": variants}
        schema = {**schema, "x-guidance": _X_GUIDANCE}
        call = 'call: "<tool_call>\\n" %json ' + json.dumps(schema, ensure_ascii=False) + ' "\\n</tool_call>"'
        repeat = self.parallel and self.mode == "required"
        start = 'start: call ("\\n" call)*' if repeat else "start: call"
        return GrammarSpec("lark", start + "\n" + call + "\n", param="tools")


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
    spec = fmt.get("json_schema")
    where = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise bad_request(f"'{where}' must be an object, got {type_name(spec)}", param=where)
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not _TOOL_NAME.match(name)):
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
    text = _schema_text(schema, f"{where}.schema")
    return GrammarSpec("json_schema", text, param=f"{where}.schema")


def parse_tools(body: Body) -> ToolSetup | None:
    """None when the request has no tools or `tool_choice` is "none" (tools then play no part)."""
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    parallel = opt_bool(body, "parallel_tool_calls")
    if choice is None:
        choice = "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise bad_request(
                f"'tool_choice' must be none, auto, required or a function object, got {choice!r}",
                param="tool_choice",
            )
        if choice == "required" and not tools:
            raise bad_request("'tool_choice' required needs a non-empty 'tools'", param="tool_choice")
        if choice == "none" or not tools:
            return None
        return ToolSetup(tools, "auto" if choice == "auto" else "required", None, parallel is not False)
    name = _named_choice(choice)
    if name not in {t.name for t in tools}:
        raise bad_request(
            f"'tool_choice' names function {name!r}, which is not in 'tools'", param="tool_choice"
        )
    return ToolSetup(tools, "named", name, parallel is not False)


def _named_choice(choice: Any) -> str:
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise bad_request(
            '\'tool_choice\' must be none, auto, required or {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    return name


def _tools(value: Any) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad_request(
            f"'tools' must be an array, got {type_name(value)}", param="tools", code="invalid_type"
        )
    tools = tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(value))
    names = [t.name for t in tools]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise bad_request(f"'tools' holds two functions named {n!r}", param=f"tools[{i}].function.name")
    return tools


def _tool(value: Any, where: str) -> Tool:
    if not isinstance(value, dict):
        raise bad_request(f"'{where}' must be an object, got {type_name(value)}", param=where)
    if value.get("type") != "function":
        raise bad_request(
            f"'{where}.type' must be 'function', got {value.get('type')!r}", param=f"{where}.type"
        )
    fn = value.get("function")
    if not isinstance(fn, dict):
        raise bad_request(
            f"'{where}.function' must be an object, got {type_name(fn)}", param=f"{where}.function"
        )
    name = fn.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.match(name):
        raise bad_request(
            f"'{where}.function.name' must be 1-64 letters, digits, '_', '-' or '.', got {name!r}",
            param=f"{where}.function.name",
        )
    desc = fn.get("description")
    if desc is not None and not isinstance(desc, str):
        raise bad_request(
            f"'{where}.function.description' must be a string", param=f"{where}.function.description"
        )
    params = fn.get("parameters")
    if params is None:
        params = dict(_EMPTY_PARAMETERS)
    if not isinstance(params, dict):
        raise bad_request(
            f"'{where}.function.parameters' must be a JSON Schema object, got {type_name(params)}",
            param=f"{where}.function.parameters",
        )
    strict = fn.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(f"'{where}.function.strict' must be a boolean", param=f"{where}.function.strict")
    _schema_text(params, f"{where}.function.parameters")
    return Tool(name, desc, params)


def _schema_text(schema: dict[str, Any], where: str) -> str:
    try:
        return json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, RecursionError) as exc:
        raise bad_request(f"'{where}' is not valid JSON: {exc}", param=where) from exc
