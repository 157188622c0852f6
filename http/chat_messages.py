"""Chat `messages` -> plain `[{"role", "content": str}]` for the chat template, or a 400 naming the spot."""

from __future__ import annotations

from typing import Any

from .errors import bad_request, unsupported
from .fields import type_name

# "developer" is OpenAI's newer name for the system role.
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def parse_messages(value: Any) -> list[dict[str, str]]:
    if value is None:
        raise bad_request("you must provide 'messages'", param="messages", code="missing_required_parameter")
    if not isinstance(value, list) or not value:
        raise bad_request("'messages' must be a non-empty array", param="messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(value)]


def _message(msg: Any, where: str) -> dict[str, str]:
    if not isinstance(msg, dict):
        raise bad_request(f"'{where}' must be an object, got {type_name(msg)}", param=where)
    role = msg.get("role")
    if role in ("tool", "function") or msg.get("tool_calls") or msg.get("function_call"):
        raise unsupported(f"{where}.role", "(tool and function calls) is not supported")
    if not isinstance(role, str) or role not in _ROLES:  # a list or object role is unhashable
        allowed = ", ".join(sorted(_ROLES))
        raise bad_request(f"'{where}.role' must be one of {allowed}, got {role!r}", param=f"{where}.role")
    content = msg.get("content")
    if content is None and role == "assistant":
        content = ""
    return {"role": _ROLES[role], "content": _content(content, f"{where}.content")}


def _content(content: Any, where: str) -> str:
    """A string, or a list of `{"type": "text", "text": ...}` parts (joined with newlines, as vLLM does)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(
            f"'{where}' must be a string or an array of parts, got {type_name(content)}", param=where
        )
    texts = []
    for j, part in enumerate(content):
        spot = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise bad_request(f"'{spot}' must be an object", param=spot)
        if part.get("type") != "text":
            raise unsupported(f"{spot}.type", f"{part.get('type')!r} is not supported (only 'text' parts)")
        text = part.get("text")
        if not isinstance(text, str):
            raise bad_request(f"'{spot}.text' must be a string", param=f"{spot}.text")
        texts.append(text)
    return "\n".join(texts)
