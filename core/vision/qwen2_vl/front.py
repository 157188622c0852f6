"""Qwen2-VL's `VisionFront`: each `<|image_pad|>` of the rendered prompt (one per image, as the
chat template writes it) becomes its run of grid / merge^2 image tokens; the payload carries the
patches, the M-RoPE positions and the rope delta. Torch-free and stateless after construction, so
the HTTP layer's executor threads may call `expand` concurrently."""

from __future__ import annotations

from collections.abc import Sequence

from rillet.core.vision.front import MultimodalPrompt
from rillet.core.vision.image import ImageError, ImageErrorKind, ImageInput
from rillet.core.vision.payload import MmItem, MmPayload
from rillet.core.vision.qwen2_vl.pixels import Preprocessor
from rillet.core.vision.qwen2_vl.positions import mrope_positions

DEFAULT_MAX_IMAGES = 16
DEFAULT_MAX_PIXELS = 8192 * 8192


class QwenVLFront:
    def __init__(
        self,
        pre: Preprocessor,
        image_token_id: int,
        max_images: int = DEFAULT_MAX_IMAGES,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        self.pre = pre
        self.image_token_id = image_token_id
        self.max_images = max_images
        self.max_pixels = max_pixels

    def expand(self, prompt_ids: list[int], images: Sequence[ImageInput]) -> MultimodalPrompt:
        pads = [i for i, t in enumerate(prompt_ids) if t == self.image_token_id]
        if len(images) > self.max_images:
            part = images[self.max_images].part
            msg = f"{len(images)} images, over the limit of {self.max_images}"
            raise ImageError(ImageErrorKind.TOO_MANY_IMAGES, part, msg)
        if len(pads) != len(images):
            part = images[0].part if images else "messages"
            msg = f"the prompt has {len(pads)} image placeholders for {len(images)} images"
            raise ImageError(ImageErrorKind.NOT_SUPPORTED, part, msg)
        ids: list[int] = []
        items: list[MmItem] = []
        at = 0
        merge2 = self.pre.merge_size**2
        for pad, img in zip(pads, images, strict=True):
            ids += prompt_ids[at:pad]
            pixels, grid = self.pre.patches(img.image)
            n = grid[0] * grid[1] * grid[2] // merge2
            items.append(MmItem(len(ids), n, img.content_hash, pixels, grid))
            ids += [self.image_token_id] * n
            at = pad + 1
        ids += prompt_ids[at:]
        positions, delta = mrope_positions(len(ids), items, self.pre.merge_size)
        payload = MmPayload(tuple(items), positions, delta)
        return MultimodalPrompt(ids, sum(it.length for it in items), payload if items else None)
