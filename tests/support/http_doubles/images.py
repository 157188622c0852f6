"""Small images for the image-input tests, made with Pillow: bytes in a format, data: URLs."""

from __future__ import annotations

import base64
import io
import random

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


def noise_png(width: int, height: int, seed: int = 0) -> bytes:
    """Random pixels: a PNG that does not compress (its size is about 3 bytes a pixel)."""
    pixels = random.Random(seed).randbytes(width * height * 3)
    buf = io.BytesIO()
    Image.frombytes("RGB", (width, height), pixels).save(buf, format="PNG")
    return buf.getvalue()
