"""Chat `messages` -> plain message dicts for the chat template, or a 400 naming the spot.

Every message becomes `{"role", "content": str}`; an assistant message that called tools also keeps
`tool_calls` (OpenAI shape, `arguments` a JSON string), and a `tool` message its `tool_call_id`.
How tool turns reach the prompt (natively, or rewritten as text) is tool_prompt.py's business.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rillet.http.openai.errors import bad_request, unsupported
from rillet.http.openai.fields import type_name

# "developer" is OpenAI's newer name for the system role.
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def parse_messages(value: Any) -> list[dict[str, Any]]:
    if value is None:
        raise bad_request("you must provide 'messages'", param="messages", code="missing_required_parameter")
    if not isinstance(value, list) or not value:
        raise bad_request("'messages' must be a non-empty array", param="messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(value)]


def _message(msg: Any, where: str) -> dict[str, Any]:
    if not isinstance(msg, dict):
        raise bad_request(f"'{where}' must be an object, got {type_name(msg)}", param=where)
    role = msg.get("role")
    if role == "function" or msg.get("function_call"):
        raise unsupported(f"{where}.role", "(the deprecated function calls) is not supported; use tools")
    if not isinstance(role, str) or role not in _ROLES:  # a list or object role is unhashable
        allowed = ", ".join(sorted(_ROLES))
        raise bad_request(f"'{where}.role' must be one of {allowed}, got {role!r}", param=f"{where}.role")
    content = msg.get("content")
    calls = msg.get("tool_calls")
    if content is None and role == "assistant":
        content = ""
    out: dict[str, Any] = {"role": _ROLES[role], "content": text_content(content, f"{where}.content")}
    if calls is not None and calls != []:
        if role != "assistant":
            raise bad_request(
                f"'{where}.tool_calls' is only allowed on assistant messages", param=f"{where}.tool_calls"
            )
        out["tool_calls"] = _tool_calls(calls, f"{where}.tool_calls")
    if role == "tool":
        call_id = msg.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise bad_request(f"'{where}.tool_call_id' must be a string", param=f"{where}.tool_call_id")
        out["tool_call_id"] = call_id
    return out


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad_request(f"'{where}' must be an array, got {type_name(calls)}", param=where)
    out = []
    for j, call in enumerate(calls):
        spot = f"{where}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            raise bad_request(f"'{spot}' must be an object with a 'function' object", param=spot)
        name, args = fn.get("name"), fn.get("arguments")
        if not isinstance(name, str):
            raise bad_request(f"'{spot}.function.name' must be a string", param=f"{spot}.function.name")
        if args is None:
            args = "{}"
        if not isinstance(args, str):
            raise bad_request(
                f"'{spot}.function.arguments' must be a JSON string", param=f"{spot}.function.arguments"
            )
        call_id = call.get("id")
        out.append(
            {
                "id": call_id if isinstance(call_id, str) else f"call_{j}",
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
        )
    return out


# A content part's type -> the key of its text. Chat's parts; /v1/responses passes its own.
CHAT_PARTS: Mapping[str, str] = {"text": "text"}


def text_content(content: Any, where: str, parts: Mapping[str, str] = CHAT_PARTS) -> str:
    """A string, or a list of text parts (of the types in `parts`) joined with newlines, as vLLM does."""
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
            raise bad_request(f"'{spot}' must be an object, got {type_name(part)}", param=spot)
        kind = part.get("type")
        key = parts.get(kind) if isinstance(kind, str) else None
        if key is None:
            known = ", ".join(repr(k) for k in parts)
            raise unsupported(f"{spot}.type", f"{kind!r} is not supported (only {known} parts)")
        text = part.get(key)
        if not isinstance(text, str):
            raise bad_request(f"'{spot}.{key}' must be a string", param=f"{spot}.{key}")
        texts.append(text)
    return "\n".join(texts)
