"""Anthropic `tools` (`name`, `description`, `input_schema`) and `tool_choice` -> the chat path's
ToolSetup, or a 400 naming the field.

`tool_choice`: `{"type": "auto"}` (the default with tools), `{"type": "any"}` (a call is forced:
chat's `required`), `{"type": "tool", "name"}` (that tool: chat's named function), `{"type": "none"}`
(tools play no part); `disable_parallel_tool_use: true` allows one call only. Server tools (web
search, code execution, bash, text editor, ...) are refused: the server runs none.
"""

from __future__ import annotations

from typing import Any

from rillet.http.openai.errors import bad_request, unsupported
from rillet.http.openai.fields import Body, type_name
from rillet.http.openai.tools import Tool, ToolSetup, make_tool, unique_names

_CHOICES = ("auto", "any", "tool", "none")


def parse_tools(body: Body) -> ToolSetup | None:
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    if choice is None:
        choice = {"type": "auto"}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in _CHOICES:
        raise bad_request(
            "tool_choice: must be an object of type auto, any, tool or none", param="tool_choice"
        )
    assert isinstance(choice, dict)
    single = choice.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        raise bad_request(
            "tool_choice.disable_parallel_tool_use: must be a boolean",
            param="tool_choice.disable_parallel_tool_use",
        )
    parallel = not single
    if kind == "none" or (kind == "auto" and not tools):
        return None
    if not tools:
        raise bad_request(f"tool_choice: type {kind!r} needs a non-empty 'tools'", param="tool_choice")
    if kind == "auto":
        return ToolSetup(tools, "auto", None, parallel)
    if kind == "any":
        return ToolSetup(tools, "required", None, parallel)
    name = choice.get("name")
    if not isinstance(name, str) or name not in {t.name for t in tools}:
        raise bad_request(f"tool_choice.name: {name!r} is not one of the tools", param="tool_choice.name")
    return ToolSetup(tools, "named", name, parallel)


def _tools(value: Any) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad_request(f"tools: must be an array, got {type_name(value)}", param="tools")
    tools = []
    for i, t in enumerate(value):
        where = f"tools.{i}"
        if not isinstance(t, dict):
            raise bad_request(f"{where}: must be an object, got {type_name(t)}", param=where)
        kind = t.get("type")
        if kind not in (None, "custom"):
            raise unsupported(
                f"{where}.type", f"{kind!r} (a server tool) is not supported: only custom tools"
            )
        if "input_schema" not in t:
            raise bad_request(f"{where}.input_schema: Field required", param=f"{where}.input_schema")
        tools.append(make_tool(t, f"tools[{i}]", parameters="input_schema"))
    return unique_names(tuple(tools), "tools[{}].name")
