"""How tools reach the prompt, and the tool-call text format the model is asked to write.

A chat template that renders tools itself (it mentions `tools`) gets them as the `tools` variable,
and the messages of earlier tool turns as they are (HF's convention: an assistant message's
`tool_calls[].function.arguments` as an object, `tool` messages with their content).

Otherwise (the default SmolLM2 template, ChatML) the tools are injected into the system prompt in
the Hermes / Qwen2.5 format, which llama.cpp and ollama also use for such models:

    <system prompt, if any>

    # Tools

    You may call one or more functions to assist with the user query.

    You are provided with function signatures within <tools></tools> XML tags:
    <tools>
    {"type": "function", "function": {"name": ..., "description": ..., "parameters": ...}}
    </tools>

    For each function call, return a json object with function name and arguments within
    <tool_call></tool_call> XML tags:
    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>

(one tool per line inside <tools>; the system message is created when the request has none, so the
template's default system prompt is then replaced). Earlier turns are rewritten to text in the same
format: an assistant's tool calls become `<tool_call>` blocks after its content, and a `tool`
message becomes a user message `<tool_response>\\n{content}\\n</tool_response>`. The model's
answer is read back by tool_calls.py, which understands that format in every case.
"""

from __future__ import annotations

import json
from typing import Any

from rillet.http.openai.tools import Tool

TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def template_renders_tools(tokenizer: Any) -> bool:
    return "tools" in str(getattr(tokenizer, "chat_template", "") or "")


def tools_block(tools: tuple[Tool, ...]) -> str:
    lines = "\n".join(json.dumps(t.openai(), ensure_ascii=False) for t in tools)
    return TOOLS_INTRO + lines + TOOLS_OUTRO


def call_text(name: str, arguments: str) -> str:
    """One call in the format the model is asked to write (arguments: JSON text, kept as given)."""
    return (
        '<tool_call>\n{"name": '
        + json.dumps(name, ensure_ascii=False)
        + ', "arguments": '
        + arguments
        + "}\n</tool_call>"
    )


def for_template(
    messages: list[dict[str, Any]], tools: tuple[Tool, ...] | None, native: bool
) -> list[dict[str, Any]]:
    """The messages as the chat template should see them (tools: None = not offered)."""
    if native:
        return [_native(m) for m in messages]
    out = [_as_text(m) for m in messages]
    if tools:
        block = tools_block(tools)
        if out and out[0]["role"] == "system":
            first = out[0]["content"]
            out[0] = {"role": "system", "content": f"{first}\n\n{block}" if first else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _as_text(m: dict[str, Any]) -> dict[str, Any]:
    if m["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
    calls = m.get("tool_calls")
    if not calls:
        return {"role": m["role"], "content": m["content"]}
    parts = [m["content"]] if m["content"] else []
    parts += [call_text(c["function"]["name"], _args_text(c["function"]["arguments"])) for c in calls]
    return {"role": "assistant", "content": "\n".join(parts)}


def _args_text(arguments: str) -> str:
    """Arguments as given when they are a JSON object, else wrapped as a JSON string."""
    try:
        return arguments if isinstance(json.loads(arguments), dict) else json.dumps(arguments)
    except ValueError:
        return json.dumps(arguments)


def _native(m: dict[str, Any]) -> dict[str, Any]:
    calls = m.get("tool_calls")
    if not calls:
        return m
    native_calls = []
    for c in calls:
        try:
            args: Any = json.loads(c["function"]["arguments"])
        except ValueError:
            args = c["function"]["arguments"]
        native_calls.append({**c, "function": {"name": c["function"]["name"], "arguments": args}})
    return {**m, "tool_calls": native_calls}
