"""What a vision-language family implements for the engine (the Gemma 3 and Qwen2-VL families do):

- a `VisionFront` (core/vision/front.py) whose `expand` preprocesses the images into an
  `MmPayload` (payload.py): one `MmItem` per image with its placeholder run, and for an M-RoPE
  family the prompt's three position streams and its rope delta;
- a `VisionTower`: `encode(items)` runs the tower (and projector) over a batch of images and returns
  each image's embeddings, [item.length, text hidden size], which replace the image tokens'
  embeddings at prefill (after the text embedding scale: image embeddings are never scaled);
  `load_weights` takes the checkpoint tensors its names claim (`claims(name)`).

The engine does the rest: the encoder cache and budget (encoder_cache.py), the prefix cache's image
hashes (core/engine/block_manager.py), chunked prefill (slices of an image's cached embeddings),
M-RoPE positions at prefill and position + delta at decode (mm_step.py). A family is chosen by
config.json's model_type in setup.py's `load_vision` (and attach.py's `is_vision_folder`), which
returns a `VisionModel(front, tower)`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from rillet.core.vision.payload import MmItem

if TYPE_CHECKING:
    import torch


class VisionTower(Protocol):
    def encode(self, items: Sequence[MmItem]) -> list[torch.Tensor]: ...

    def claims(self, name: str) -> bool: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None: ...

