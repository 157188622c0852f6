"""Anthropic `system` and `messages` -> chat messages (chat_messages.py's shape), or a 400.

Content is a string or blocks: `text`; an assistant's `tool_use` (`id`, `name`, `input`) becomes a
chat tool call (arguments = the input as JSON); a user's `tool_result` (`tool_use_id`, `content` a
string or text blocks, `is_error`) becomes a `tool` message, before the user's other text. A user's
`image` blocks (decoded before parsing, http/vision/) make its content chat_messages.py's list of
parts. Thinking blocks are skipped (the model does not think); documents, server-tool blocks and
images anywhere but a user's content are refused naming the spot, and so is a final assistant
message (a prefill to continue).
"""

from __future__ import annotations

import json
from typing import Any

from rillet.http.openai.chat_messages import Images, image_entry
from rillet.http.openai.errors import bad_request, unsupported
from rillet.http.openai.fields import type_name

_SKIPPED = ("thinking", "redacted_thinking")


def chat_messages(system: Any, messages: Any, images: Images | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if system is not None:
        text = _text(system, "system")
        if text:
            out.append({"role": "system", "content": text})
    if messages is None:
        raise bad_request("messages: Field required", param="messages", code="missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise bad_request(f"messages: must be a non-empty array, got {type_name(messages)}", param="messages")
    for i, msg in enumerate(messages):
        _message(msg, f"messages.{i}", out, images)
    if out[-1]["role"] == "assistant":
        raise unsupported(
            "messages", "ending with an assistant message (a prefill to continue) is not supported"
        )
    return out


def _message(msg: Any, where: str, out: list[dict[str, Any]], images: Images | None) -> None:
    if not isinstance(msg, dict):
        raise bad_request(f"{where}: must be an object, got {type_name(msg)}", param=where)
    role = msg.get("role")
    if role not in ("user", "assistant"):
        raise bad_request(f"{where}.role: must be 'user' or 'assistant', got {role!r}", param=f"{where}.role")
    content = msg.get("content")
    spot = f"{where}.content"
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        return
    if not isinstance(content, list):
        raise bad_request(
            f"{spot}: must be a string or an array of blocks, got {type_name(content)}", param=spot
        )
    if role == "assistant":
        out.append(_assistant(content, spot))
        return
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        kind = _kind(block, f"{spot}.{j}")
        if kind == "tool_result":
            out.append(_tool_result(block, f"{spot}.{j}"))
        elif kind == "text":
            parts.append({"type": "text", "text": _block_text(block, f"{spot}.{j}")})
        elif kind == "image":
            parts.append(image_entry(images, f"{spot}.{j}"))
        elif kind not in _SKIPPED:
            raise unsupported(f"{spot}.{j}.type", f"{kind!r} blocks are not supported")
    if any(p["type"] == "image" for p in parts):
        out.append({"role": "user", "content": parts})
    elif parts or not content:
        out.append({"role": "user", "content": "\n".join(p["text"] for p in parts)})


def _assistant(content: list[Any], spot: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        where = f"{spot}.{j}"
        kind = _kind(block, where)
        if kind == "text":
            texts.append(_block_text(block, where))
        elif kind == "tool_use":
            calls.append(_tool_use(block, where))
        elif kind not in _SKIPPED:
            raise unsupported(f"{where}.type", f"{kind!r} blocks are not supported")
    turn: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        turn["tool_calls"] = calls
    return turn


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, name, args = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise bad_request(f"{where}: a tool_use block needs a string 'id' and 'name'", param=where)
    if not isinstance(args, dict):
        raise bad_request(f"{where}.input: must be an object, got {type_name(args)}", param=f"{where}.input")
    arguments = json.dumps(args, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise bad_request(f"{where}.tool_use_id: must be a string", param=f"{where}.tool_use_id")
    content = block.get("content")
    text = "" if content is None else _text(content, f"{where}.content")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise bad_request(f"{where}.is_error: must be a boolean", param=f"{where}.is_error")
    return {"role": "tool", "content": f"Error: {text}" if is_error else text, "tool_call_id": call_id}


def _text(value: Any, where: str) -> str:
    """A string, or text blocks joined with newlines."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(
            f"{where}: must be a string or an array of text blocks, got {type_name(value)}", param=where
        )
    texts = []
    for j, block in enumerate(value):
        kind = _kind(block, f"{where}.{j}")
        if kind != "text":
            raise unsupported(f"{where}.{j}.type", f"{kind!r} blocks are not supported here (text only)")
        texts.append(_block_text(block, f"{where}.{j}"))
    return "\n".join(texts)


def _kind(block: Any, where: str) -> str:
    if not isinstance(block, dict):
        raise bad_request(f"{where}: must be an object, got {type_name(block)}", param=where)
    kind = block.get("type")
    if not isinstance(kind, str):
        raise bad_request(f"{where}.type: must be a string, got {type_name(kind)}", param=f"{where}.type")
    return kind


def _block_text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise bad_request(f"{where}.text: must be a string, got {type_name(text)}", param=f"{where}.text")
    return text
