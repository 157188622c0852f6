"""Anthropic message bodies: the non-streaming answer, and the pieces the stream shares with it.

Content: a `text` block (when there is text, or nothing else), then a `tool_use` block per call the
answer makes (tools offered: the text is read for `<tool_call>` blocks, openai/tool_calls.py), its
`input` the parsed arguments. `stop_reason`: `tool_use` when it calls, `max_tokens`, `stop_sequence`
(with `stop_sequence` set to the string), else `end_turn`. A call cut by max_tokens is not
answered (its arguments are unfinished JSON); a call whose arguments are not a JSON object is
given back as text.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from rillet.http.openai.bodies import ChoiceResult
from rillet.http.openai.chunks import Usage
from rillet.http.openai.tool_calls import parse_all
from rillet.http.openai.tool_prompt import call_text


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def stop_reason(finish: str | None, stop_str: str | None, calls: bool) -> str:
    if calls:
        return "tool_use"
    if finish == "length":
        return "max_tokens"
    return "stop_sequence" if stop_str is not None else "end_turn"


def usage_body(usage: Usage) -> dict[str, Any]:
    """Anthropic counts cache reads apart: input_tokens are the prompt tokens that were computed."""
    cached = usage.body()["prompt_tokens_details"]["cached_tokens"]
    return {
        "input_tokens": usage.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": usage.completion_tokens,
    }


def tool_input(arguments: str) -> dict[str, Any] | None:
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def message_body(mid: str, model: str, result: ChoiceResult, usage: Usage, tools: bool) -> dict[str, Any]:
    text, blocks = result.text, []
    if tools:
        parsed = parse_all(result.text)
        text = parsed.content
        for name, args in parsed.complete(result.finish_reason):
            value = tool_input(args)
            if value is None:
                text += call_text(name, args)
            else:
                blocks.append({"type": "tool_use", "id": new_id("toolu"), "name": name, "input": value})
    content = [{"type": "text", "text": text}] if text.strip() or not blocks else []
    stop = stop_reason(result.finish_reason, result.stop_str, bool(blocks))
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content + blocks,
        "stop_reason": stop,
        "stop_sequence": result.stop_str if stop == "stop_sequence" else None,
        "usage": usage_body(usage),
    }
