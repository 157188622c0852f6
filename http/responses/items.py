"""Responses `input` (a string, or a list of items) -> chat messages (chat_messages.py's shape).

Items: messages (`role` user / assistant / system / developer; content a string or parts of type
`input_text` / `output_text`), `function_call` (an assistant's call: `call_id`, `name`,
`arguments`), `function_call_output` (its result: `call_id`, `output`). Consecutive calls join the
assistant message before them, as chat's `tool_calls`; an output becomes a `tool` message. A user
message's `input_image` parts (decoded before parsing, http/vision/) make its content
chat_messages.py's list of parts. Items of type `reasoning` carry nothing this model can use and
are skipped; images elsewhere or for a text model, files, audio and item references are refused
naming the spot.
"""

from __future__ import annotations

from typing import Any

from rillet.http.openai.chat_messages import Images, text_content, user_content
from rillet.http.openai.errors import bad_request, unsupported
from rillet.http.openai.fields import type_name

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
# A content part's type -> the key of its text
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
_SKIPPED = ("reasoning",)


def input_messages(value: Any, images: Images | None = None) -> list[dict[str, Any]]:
    if value is None:
        raise bad_request("you must provide 'input'", param="input", code="missing_required_parameter")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request(
            f"'input' must be a string or a non-empty array of items, got {type_name(value)}", param="input"
        )
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        _item(item, f"input[{i}]", out, images)
    return out


def _item(item: Any, where: str, out: list[dict[str, Any]], images: Images | None) -> None:
    if not isinstance(item, dict):
        raise bad_request(f"'{where}' must be an object, got {type_name(item)}", param=where)
    kind = item.get("type", "message")
    if kind == "message":
        out.append(_message(item, where, images))
    elif kind == "function_call":
        _function_call(item, where, out)
    elif kind == "function_call_output":
        out.append(_function_output(item, where))
    elif kind not in _SKIPPED:
        raise unsupported(f"{where}.type", f"{kind!r} is not supported")


def _message(item: dict[str, Any], where: str, images: Images | None) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise bad_request(
            f"'{where}.role' must be one of assistant, developer, system, user, got {role!r}",
            param=f"{where}.role",
        )
    spot = f"{where}.content"
    if role == "user":
        content = user_content(item.get("content"), spot, images, _TEXT_PARTS, "input_image")
    else:
        content = text_content(item.get("content"), spot, _TEXT_PARTS)
    return {"role": _ROLES[role], "content": content}


def _function_call(item: dict[str, Any], where: str, out: list[dict[str, Any]]) -> None:
    name, args, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
    for field, value in (("name", name), ("arguments", args), ("call_id", call_id)):
        if not isinstance(value, str):
            raise bad_request(
                f"'{where}.{field}' must be a string, got {type_name(value)}", param=f"{where}.{field}"
            )
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
    last = out[-1] if out else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _function_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise bad_request(
            f"'{where}.call_id' must be a string, got {type_name(call_id)}", param=f"{where}.call_id"
        )
    output = text_content(item.get("output"), f"{where}.output", _TEXT_PARTS)
    return {"role": "tool", "content": output, "tool_call_id": call_id}
