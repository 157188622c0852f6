"""A vision-language model's front end for the fake engine: `FakeVision` (core/vision/front.py's
`VisionFront`) and `PartsTokenizer`, the byte tokenizer with a chat template that takes
transformers' list-of-parts content.

The template writes each image entry as one `PLACEHOLDER` byte; `expand` replaces the n-th
placeholder with `image_tokens(n-th image)` copies of `IMAGE_TOKEN` (a count that depends on the
image's size, as Qwen2-VL's does), refuses a placeholder count that differs from the images (as
the real fronts must), and records every call's images so a test sees what reached it, in order."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from rillet.core.vision.front import MultimodalPrompt
from rillet.core.vision.image import ImageError, ImageErrorKind, ImageInput

from http_doubles.byte_tokenizer import BOOM_MARKER, FakeTokenizer

PLACEHOLDER = 1  # the byte the template writes for an image entry
IMAGE_TOKEN = 2  # what expand writes in its place


def image_tokens(image: ImageInput) -> int:
    return max(1, image.image.width * image.image.height // 64)


class PartsTokenizer(FakeTokenizer):
    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        lines = []
        for m in messages:
            content = m["content"]
            if isinstance(content, list):
                content = "".join(chr(PLACEHOLDER) if p["type"] == "image" else p["text"] for p in content)
            if BOOM_MARKER in content:
                raise RuntimeError("template exploded")
            lines.append(f"<{m['role']}>{content}\n")
        return "".join(lines) + ("<assistant>" if add_generation_prompt else "")


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class FakeVision:
    def __init__(self, max_images: int, max_pixels: int) -> None:
        self.max_images = max_images
        self.max_pixels = max_pixels
        self.calls: list[list[ImageInput]] = []  # each expand's images (prompts without any too)
        self.on_loop: list[bool] = []  # per call: did it run on a thread with a running event loop
        self._lock = threading.Lock()

    def expand(self, prompt_ids: list[int], images: Sequence[ImageInput]) -> MultimodalPrompt:
        with self._lock:
            self.calls.append(list(images))
            self.on_loop.append(_loop_running())
        if prompt_ids.count(PLACEHOLDER) != len(images):
            msg = f"{prompt_ids.count(PLACEHOLDER)} image placeholders for {len(images)} images"
            raise ImageError(ImageErrorKind.NOT_SUPPORTED, "", msg)
        out: list[int] = []
        queue = list(images)
        for t in prompt_ids:
            out += [IMAGE_TOKEN] * image_tokens(queue.pop(0)) if t == PLACEHOLDER else [t]
        mm = tuple(image.content_hash for image in images)
        return MultimodalPrompt(out, len(out) - len(prompt_ids) + len(images), mm)
