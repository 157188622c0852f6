"""`tools`, `tool_choice` and `parallel_tool_calls` -> a tool setup (and, when a call is forced, its
grammar), or a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from rillet.core.structured.schema import close_objects
from rillet.core.structured.spec import GrammarSpec
from rillet.http.openai.errors import bad_request
from rillet.http.openai.fields import Body, opt_bool, type_name
from rillet.http.openai.response_format import NAME, schema_text

_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

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

    def grammar(self, json_options: dict[str, str | bool], max_calls: int) -> GrammarSpec | None:
        """`required` / named: a Lark grammar of `<tool_call>` blocks whose JSON has the chosen
        function's name and arguments valid for its parameters, laid out as `json_options` says
        (core/structured/json_style.py); one call, or up to `max_calls` with parallel_tool_calls
        under `required`. `auto`: none (free text)."""
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
        schema = {**schema, "x-guidance": json_options}
        call = 'call: "<tool_call>\\n" %json ' + json.dumps(schema, ensure_ascii=False) + ' "\\n</tool_call>"'
        more = max_calls - 1 if self.parallel and self.mode == "required" else 0
        start = f'start: call ("\\n" call){{0,{more}}}' if more else "start: call"
        return GrammarSpec("lark", start + "\n" + call + "\n", param="tools")


def parse_tools(body: Body) -> ToolSetup | None:
    """None when the request has no tools or `tool_choice` is "none" (tools then play no part)."""
    tools = _tools(body.get("tools"))
    parallel = opt_bool(body, "parallel_tool_calls") is not False
    return choose_tools(tools, body.get("tool_choice"), parallel, _named_choice)


def choose_tools(
    tools: tuple[Tool, ...], choice: Any, parallel: bool, named: Callable[[Any], str]
) -> ToolSetup | None:
    """`tool_choice` over parsed tools: none | auto (the default) | required, or a named function,
    whose name `named` reads in its API's shape (or raises its 400). None: tools play no part."""
    if choice is None:
        choice = "auto"
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
        return ToolSetup(tools, "auto" if choice == "auto" else "required", None, parallel)
    name = named(choice)
    if name not in {t.name for t in tools}:
        raise bad_request(
            f"'tool_choice' names function {name!r}, which is not in 'tools'", param="tool_choice"
        )
    return ToolSetup(tools, "named", name, parallel)


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
    return unique_names(
        tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(value)), "tools[{}].function.name"
    )


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
    return make_tool(fn, f"{where}.function")


def make_tool(fn: dict[str, Any], where: str, parameters: str = "parameters") -> Tool:
    """A function definition `{name, description, <parameters>, strict}` at `where` (the field that
    holds the schema is `parameters` for OpenAI, `input_schema` for Anthropic)."""
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise bad_request(
            f"'{where}.name' must be 1-64 letters, digits, '_', '-' or '.', got {name!r}",
            param=f"{where}.name",
        )
    desc = fn.get("description")
    if desc is not None and not isinstance(desc, str):
        raise bad_request(f"'{where}.description' must be a string", param=f"{where}.description")
    params = fn.get(parameters)
    if params is None:
        params = dict(_EMPTY_PARAMETERS)
    if not isinstance(params, dict):
        raise bad_request(
            f"'{where}.{parameters}' must be a JSON Schema object, got {type_name(params)}",
            param=f"{where}.{parameters}",
        )
    strict = fn.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(f"'{where}.strict' must be a boolean", param=f"{where}.strict")
    schema_text(params, f"{where}.{parameters}")
    return Tool(name, desc, params)


def unique_names(tools: tuple[Tool, ...], name_field: str) -> tuple[Tool, ...]:
    """`name_field` formats the index: "tools[{}].name"."""
    names = [t.name for t in tools]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise bad_request(f"'tools' holds two functions named {n!r}", param=name_field.format(i))
    return tools
