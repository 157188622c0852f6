"""The contract between the HTTP layer and a vision-language model: the engine's `vision` attribute
(None for a text-only model) turns a rendered, tokenized chat prompt and the request's decoded
images into the engine's request.

The flow, for every API (chat, Messages, Responses):
1. the front end decodes each image part into an `ImageInput` (core/vision/image.py), in order of
   appearance, and gives the chat template messages whose content is a list of parts:
   `{"type": "text", "text": ...}` and `{"type": "image"}` (transformers' convention: the template
   writes the family's placeholder for each image entry);
2. it renders and tokenizes the prompt as for text;
3. `engine.vision.expand(prompt_ids, images)` preprocesses the images (CPU work, torch-free; the
   front end calls it off the event loop) and expands each image's placeholder into its run of
   image tokens, in order; a placeholder count that does not match the images is an ImageError;
4. the request goes in with `prompt_ids=mp.prompt_ids` and `mm=mp.mm` (NewRequest.mm), and
   `usage.prompt_tokens` counts `len(mp.prompt_ids)` (image tokens included)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rillet.core.vision.image import ImageInput


@dataclass(frozen=True, eq=False)
class MultimodalPrompt:
    prompt_ids: list[int]  # placeholders expanded: one id per image token
    image_tokens: int  # how many of them stand for images
    mm: object  # the engine's own payload for these images; passed on unchanged as NewRequest.mm


class VisionFront(Protocol):
    max_images: int  # vision.max_images: more image parts in one request is an ImageError
    max_pixels: int  # what decode_image refuses beyond

    def expand(self, prompt_ids: list[int], images: Sequence[ImageInput]) -> MultimodalPrompt: ...
