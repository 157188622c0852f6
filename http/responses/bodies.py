"""Response objects and output items: the pieces the non-streaming answer, the stream's events and
the store share, so that the three agree (the output items themselves are built by the stream's
format for both paths: events.py `answer_output`).

Output of one answer, in the order generated: `message` items with one `output_text` part (text;
one when there is nothing else) and one `function_call` item per call the answer makes (tools
offered: the text is read for `<tool_call>` blocks, openai/tool_calls.py). An answer cut by
max_output_tokens is `incomplete` (`incomplete_details.reason: max_output_tokens`), and so is its
last item: a call cut inside its arguments is never a completed call.
"""

from __future__ import annotations

import uuid
from typing import Any

from rillet.http.openai.chunks import Usage


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [output_text(text)],
    }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def usage_body(usage: Usage) -> dict[str, Any]:
    done = usage.completion_tokens
    cached = usage.body()["prompt_tokens_details"]["cached_tokens"]
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": done,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + done,
    }


def response_object(
    rid: str,
    created: int,
    model: str,
    echo: dict[str, Any],
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": incomplete,
        "model": model,
        "output": output,
        "usage": usage,
        **echo,
    }


def status_of(output: list[dict[str, Any]], finish_reason: str | None) -> str:
    if finish_reason == "length" or any(item["status"] == "incomplete" for item in output):
        return "incomplete"
    return "completed"


def conversation_after(messages: list[dict[str, Any]], output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation a later `previous_response_id` continues: `messages` and this answer as
    one assistant turn (chat shape; its complete calls as `tool_calls`, ids = their `call_id`)."""
    text = "".join(item["content"][0]["text"] for item in output if item["type"] == "message")
    calls = [
        {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in output
        if i["type"] == "function_call" and i["status"] == "completed"
    ]
    turn: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        turn["tool_calls"] = calls
    return [*messages, turn]
