"""Where one image part's bytes come from: an `ImageSource` read from a URL string (a data: URL, an
http(s) URL, a file:// URL or an absolute path) or from Anthropic's base64 source, and the
base64 payload's decoding. No I/O here: loader.py fetches and reads."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit

from rillet.core.vision.image import ImageError, ImageErrorKind

SourceKind = Literal["base64", "http", "path"]
# data: URLs with these media types are decoded (others are not images); Pillow reads the bytes
# whatever the type says, so the check stays loose.
_GENERIC_TYPES = ("", "application/octet-stream")


@dataclass(frozen=True)
class ImageSource:
    part: str  # where the image is in the request (`messages[1].content[0]`)
    kind: SourceKind
    value: str  # the base64 payload, the http(s) URL, or the local path (a file:// URL's, unquoted)


def url_source(url: str, part: str) -> ImageSource:
    lower = url[:8].lower()
    if lower.startswith("data:"):
        return data_url_source(url, part)
    if lower.startswith(("http://", "https://")):
        return ImageSource(part, "http", url)
    if lower.startswith("file://"):
        split = urlsplit(url)
        if split.netloc not in ("", "localhost"):
            raise ImageError(ImageErrorKind.FORBIDDEN, part, "a file:// URL must name no host")
        return ImageSource(part, "path", unquote(split.path))
    if url.startswith("/"):
        return ImageSource(part, "path", url)
    msg = "an image URL must be a data: URL, an http(s):// or file:// URL, or an absolute path"
    raise ImageError(ImageErrorKind.FORBIDDEN, part, msg)


def data_url_source(url: str, part: str) -> ImageSource:
    """`data:[<media type>][;base64],<payload>`: only base64 payloads are taken."""
    header, comma, payload = url[len("data:") :].partition(",")
    params = [p.strip().lower() for p in header.split(";")]
    if not comma or "base64" not in params[1:]:
        raise ImageError(ImageErrorKind.NOT_BASE64, part, "a data: URL must be `data:<type>;base64,<data>`")
    media_type = params[0]
    if not (media_type.startswith("image/") or media_type in _GENERIC_TYPES):
        msg = f"the data: URL's media type is {media_type!r}, not an image type"
        raise ImageError(ImageErrorKind.NOT_AN_IMAGE, part, msg)
    return ImageSource(part, "base64", payload)


def decode_base64(payload: str, part: str, max_bytes: int) -> bytes:
    """The payload's bytes; whitespace (line-wrapped base64) and missing padding are tolerated."""
    if len(payload) // 4 * 3 > max_bytes + 3:  # before decoding: base64 holds 3 bytes per 4 characters
        raise too_large(part, max_bytes)
    compact = "".join(payload.split())
    compact += "=" * (-len(compact) % 4)
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as e:  # ValueError: characters outside ASCII
        raise ImageError(ImageErrorKind.NOT_BASE64, part, "the image data is not valid base64") from e
    if len(data) > max_bytes:
        raise too_large(part, max_bytes)
    if not data:
        raise ImageError(ImageErrorKind.NOT_AN_IMAGE, part, "the image data is empty")
    return data


def too_large(part: str, max_bytes: int) -> ImageError:
    msg = f"the image is over the limit of {max_bytes} bytes (vision.max_image_bytes)"
    return ImageError(ImageErrorKind.TOO_LARGE, part, msg)
