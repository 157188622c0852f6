"""Where each API keeps its image parts, and each part's shape -> an `ImageSource` (a 400 naming the
field when the shape is wrong). Only user turns carry images; an image part anywhere else meets
the API's parser, which refuses it as before.

- OpenAI chat (and /tokenize's `messages`): `messages[i].content[j]`,
  `{"type": "image_url", "image_url": {"url", "detail"}}`, or `"image_url": "<url>"` as some
  clients send it.
- Anthropic Messages (and count_tokens): `messages.i.content.j`, `{"type": "image", "source":
  {"type": "base64", "media_type", "data"} | {"type": "url", "url"}}`; a `file` source is refused.
- Responses: `input[i].content[j]`, `{"type": "input_image", "image_url", "detail"}`; `file_id`
  is refused.

`detail` (auto, low or high) is checked and otherwise ignored: the model's own processor
(preprocessor_config.json) sets the resolution an image is seen at.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rillet.http.openai.errors import bad_request, unsupported
from rillet.http.openai.fields import Body, type_name
from rillet.http.vision.sources import ImageSource, url_source

Found = list[tuple[str, dict[str, Any]]]  # (the part's place, the part)
_DETAILS = ("auto", "low", "high")


@dataclass(frozen=True)
class ImageApi:
    locate: Callable[[Body], Found]
    source: Callable[[dict[str, Any], str], ImageSource]


def _user_parts(
    turns: Any, kind: str, place: Callable[[int, int], str], is_turn: Callable[[Any], bool]
) -> Found:
    found: Found = []
    if not isinstance(turns, list):
        return found
    for i, turn in enumerate(turns):
        if not (isinstance(turn, dict) and turn.get("role") == "user" and is_turn(turn)):
            continue
        content = turn.get("content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") == kind:
                found.append((place(i, j), part))
    return found


def chat_parts(body: Body) -> Found:
    return _user_parts(body.get("messages"), "image_url", lambda i, j: f"messages[{i}].content[{j}]", bool)


def messages_parts(body: Body) -> Found:
    return _user_parts(body.get("messages"), "image", lambda i, j: f"messages.{i}.content.{j}", bool)


def responses_parts(body: Body) -> Found:
    def is_message(item: Any) -> bool:
        return bool(item.get("type", "message") == "message")

    return _user_parts(body.get("input"), "input_image", lambda i, j: f"input[{i}].content[{j}]", is_message)


def chat_source(part: dict[str, Any], where: str) -> ImageSource:
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if isinstance(value, dict):
        _detail(value.get("detail"), f"{where}.image_url.detail")
    if not isinstance(url, str) or not url:
        field = f"{where}.image_url.url" if isinstance(value, dict) else f"{where}.image_url"
        raise bad_request(f"'{field}' must be a URL string, got {type_name(url)}", param=field)
    return url_source(url, where)


def messages_source(part: dict[str, Any], where: str) -> ImageSource:
    source = part.get("source")
    spot = f"{where}.source"
    kind = source.get("type") if isinstance(source, dict) else None
    if not isinstance(source, dict):
        raise bad_request(f"{spot}: must be an object, got {type_name(source)}", param=spot)
    if kind == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if not isinstance(media_type, str) or not media_type.lower().startswith("image/"):
            msg = f"{spot}.media_type: must be an image type (image/png, image/jpeg, ...), got {media_type!r}"
            raise bad_request(msg, param=f"{spot}.media_type")
        if not isinstance(data, str) or not data:
            raise bad_request(f"{spot}.data: must be a base64 string", param=f"{spot}.data")
        return ImageSource(where, "base64", data)
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str) or not url:
            raise bad_request(f"{spot}.url: must be a URL string, got {type_name(url)}", param=f"{spot}.url")
        return url_source(url, where)
    if kind == "file":
        raise unsupported(f"{spot}.type", "'file' (the Files API) is not supported; send base64 or a URL")
    raise bad_request(f"{spot}.type: must be 'base64' or 'url', got {kind!r}", param=f"{spot}.type")


def responses_source(part: dict[str, Any], where: str) -> ImageSource:
    _detail(part.get("detail"), f"{where}.detail")
    url = part.get("image_url")
    if url is None and part.get("file_id") is not None:
        raise unsupported(f"{where}.file_id", "(an uploaded file) is not supported; send 'image_url'")
    if not isinstance(url, str) or not url:
        field = f"{where}.image_url"
        raise bad_request(f"'{field}' must be a URL string, got {type_name(url)}", param=field)
    return url_source(url, where)


def _detail(value: Any, field: str) -> None:
    if value is not None and value not in _DETAILS:
        raise bad_request(f"'{field}' must be one of auto, low, high, got {value!r}", param=field)


CHAT = ImageApi(chat_parts, chat_source)
MESSAGES = ImageApi(messages_parts, messages_source)
RESPONSES = ImageApi(responses_parts, responses_source)
