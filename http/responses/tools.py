"""Responses `tools` (function tools: `name`, `description`, `parameters`, `strict`), `tool_choice`
and `parallel_tool_calls` -> the chat path's ToolSetup, or a 400 naming the field.

`tool_choice`: `none` (tools play no part), `auto`, `required`, `{"type": "function", "name"}`.
Built-in tools (web search, file search, computer use, MCP, ...) are refused: the server has none.
"""

from __future__ import annotations

from typing import Any

from rillet.http.openai.errors import bad_request, unsupported
from rillet.http.openai.fields import Body, opt_bool, type_name
from rillet.http.openai.tools import Tool, ToolSetup, choose_tools, make_tool, unique_names


def parse_tools(body: Body) -> ToolSetup | None:
    tools = _tools(body.get("tools"))
    parallel = opt_bool(body, "parallel_tool_calls") is not False
    return choose_tools(tools, body.get("tool_choice"), parallel, _named_choice)


def _named_choice(choice: Any) -> str:
    name = choice.get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise bad_request(
            '\'tool_choice\' must be none, auto, required or {"type": "function", "name": ...}',
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
    tools = []
    for i, t in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise bad_request(f"'{where}' must be an object, got {type_name(t)}", param=where)
        if t.get("type") != "function":
            raise unsupported(
                f"{where}.type", f"{t.get('type')!r} is not supported: only function tools are served"
            )
        tools.append(make_tool(t, where))
    return unique_names(tuple(tools), "tools[{}].name")


def tools_echo(body: Body) -> list[dict[str, Any]]:
    """The `tools` field of the response object: each function as the request defined it."""
    value = body.get("tools")
    if not isinstance(value, list):
        return []
    strict = {t.get("name"): t.get("strict") for t in value if isinstance(t, dict)}
    out = []
    for t in _tools(value):
        out.append(
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": strict.get(t.name),
            }
        )
    return out
