"""Anthropic message bodies: the pieces the non-streaming answer and the stream share (the answer
itself is built by the stream's format for both paths: events.py `message_body`).

Content, in the order generated: `text` blocks (one when there is nothing else) and a `tool_use`
block per call the answer makes (tools offered: the text is read for `<tool_call>` blocks,
openai/tool_calls.py), its `input` the parsed arguments. `stop_reason`: `tool_use` when it calls,
`max_tokens`, `stop_sequence` (with `stop_sequence` set to the string), else `end_turn`. A call cut
by max_tokens is not answered (its arguments are unfinished JSON); a call whose arguments are not a
JSON object is given back as text.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from rillet.http.openai.chunks import Usage


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
