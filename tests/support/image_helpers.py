"""Small images for the image-input tests, made with Pillow: bytes in a format, data: URLs."""

from __future__ import annotations

import base64
import io

from PIL import Image


def image_bytes(
    width: int = 16, height: int = 8, fmt: str = "PNG", color: tuple[int, int, int] = (200, 30, 30)
) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format=fmt)
    return buf.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
