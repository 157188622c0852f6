"""Chat `messages` -> plain message dicts for the chat template, or a 400 naming the spot.

Every message becomes `{"role", "content": str}`, except a user message with images: its content is
then core/vision/front.py's list of parts, `{"type": "text", "text"}` and `{"type": "image",
"image": ImageInput}` in their order (the images decoded before parsing, http/vision/loader.py).
An assistant message that called tools also keeps
`tool_calls` (OpenAI shape, `arguments` a JSON string), and a `tool` message its `tool_call_id`.
How tool turns reach the prompt (natively, or rewritten as text) is tool_prompt.py's business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rillet.core.vision.front import VisionFront
from rillet.core.vision.image import ImageError, ImageErrorKind, ImageInput
from rillet.http.openai.errors import bad_request, image_refused, unsupported
from rillet.http.openai.fields import type_name

# A request's decoded images by the part they came from (`messages[1].content[0]`)
Images = Mapping[str, ImageInput]

# "developer" is OpenAI's newer name for the system role.
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def parse_messages(value: Any, images: Images | None = None) -> list[dict[str, Any]]:
    if value is None:
        raise bad_request("you must provide 'messages'", param="messages", code="missing_required_parameter")
    if not isinstance(value, list) or not value:
        raise bad_request("'messages' must be a non-empty array", param="messages")
    return [_message(m, f"messages[{i}]", images) for i, m in enumerate(value)]


def _message(msg: Any, where: str, images: Images | None) -> dict[str, Any]:
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
    spot = f"{where}.content"
    text = user_content(content, spot, images) if role == "user" else text_content(content, spot)
    out: dict[str, Any] = {"role": _ROLES[role], "content": text}
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
    return "\n".join(part_text(part, f"{where}[{j}]", parts) for j, part in enumerate(content))


def part_text(part: Any, spot: str, parts: Mapping[str, str]) -> str:
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
    return text


# ---- images --------------------------------------------------------------------------------------


def user_content(
    content: Any,
    where: str,
    images: Images | None,
    parts: Mapping[str, str] = CHAT_PARTS,
    image_type: str = "image_url",
) -> str | list[dict[str, Any]]:
    """A user turn's content: text_content's string, or the list of parts when it holds images."""
    if not isinstance(content, list) or not any(_typed(p, image_type) for p in content):
        return text_content(content, where, parts)
    return [
        image_entry(images, f"{where}[{j}]")
        if _typed(part, image_type)
        else {"type": "text", "text": part_text(part, f"{where}[{j}]", parts)}
        for j, part in enumerate(content)
    ]


def _typed(part: Any, kind: str) -> bool:
    return isinstance(part, dict) and part.get("type") == kind


def image_entry(images: Images | None, part: str) -> dict[str, Any]:
    """The chat template's entry for the image at `part` (transformers' convention)."""
    image = None if images is None else images.get(part)
    if image is None:  # not loaded: the model takes no images (the loader said so first)
        raise image_refused(ImageError(ImageErrorKind.NOT_SUPPORTED, part, "the model does not take images"))
    return {"type": "image", "image": image}


def message_images(messages: Sequence[dict[str, Any]]) -> list[ImageInput]:
    """The images of the conversation, in the order the template writes their placeholders."""
    return [
        p["image"]
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p.get("type") == "image"
    ]


def expand_prompt(
    vision: VisionFront | None, ids: list[int], messages: Sequence[dict[str, Any]], field: str
) -> tuple[list[int], object | None]:
    """core/vision/front.py's step 3: each image's placeholder -> its run of image tokens, and the
    engine's payload (NewRequest.mm; None without images). Every prompt of a vision model goes
    through it, those without images too, so a placeholder written as text cannot reach the engine
    without its image. The caller is off the event loop."""
    if vision is None:
        return ids, None
    images = message_images(messages)
    if len(images) > vision.max_images:  # a stored conversation's images count too
        msg = f"the conversation holds {len(images)} images; at most {vision.max_images} (vision.max_images)"
        raise image_refused(ImageError(ImageErrorKind.TOO_MANY_IMAGES, field, msg))
    try:
        mp = vision.expand(ids, images)
    except ImageError as e:  # without images (a placeholder typed as text) the prompt field is named
        raise image_refused(e if e.part and images else ImageError(e.kind, field, e.message)) from e
    return mp.prompt_ids, mp.mm if images else None  # a prompt without images goes in as text
