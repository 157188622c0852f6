"""How tools reach the prompt, and the tool-call text format the model is asked to write; and the
whole chat (messages and tools) through the template into prompt ids (`render_chat_ids`).

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

from rillet.http.openai.errors import bad_request
from rillet.http.openai.tools import Tool, ToolSetup

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


def render_chat_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: ToolSetup | None,
    prompt_field: str = "messages",
    add_generation_prompt: bool = True,
) -> list[int]:
    """A chat's prompt ids, for chat_request, token counting and /tokenize alike: the template's
    text, encoded without special tokens (the template already holds any BOS the model wants)."""
    text = _render_chat(tokenizer, messages, tools, prompt_field, add_generation_prompt)
    return list(tokenizer.encode(text, add_special_tokens=False))


def _render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: ToolSetup | None,
    prompt_field: str,
    add_generation_prompt: bool = True,
) -> str:
    """The messages (and tools, as the template takes them or in the system prompt) through the
    chat template; a template that refuses them is a 400 naming `prompt_field`."""
    native = template_renders_tools(tokenizer)
    rendered = for_template(messages, tools.tools if tools else None, native)
    extra: dict[str, Any] = {"tools": [t.openai() for t in tools.tools]} if native and tools else {}
    extra["add_generation_prompt"] = add_generation_prompt
    try:
        text: str = tokenizer.apply_chat_template(rendered, **extra)
    except (ValueError, TypeError, KeyError) as exc:
        raise bad_request(f"cannot apply the chat template: {exc}", param=prompt_field) from exc
    return text
