"""The engine's image payload (`NewRequest.mm`): what `VisionFront.expand` hands the engine for one
request, carried unchanged by its sequences (`Seq.mm`) to the prefill that encodes the images.

Torch-free (the HTTP layer builds it through `expand`): a family's pixels travel as numpy arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class MmItem:
    """One image of a prompt: its run of placeholder tokens [offset, offset + length)."""

    offset: int  # index of its first image token in the expanded prompt
    length: int  # image tokens (= rows of the tower's output for it)
    content_hash: bytes  # ImageInput.content_hash: the encoder cache's and the prefix cache's key
    pixels: np.ndarray  # the family's preprocessed pixels (Qwen2-VL: [patches, C*T*P*P] float32)
    grid: tuple[int, ...] = ()  # the family's grid (Qwen2-VL: (t, h, w) in patches)

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True, eq=False)
class MmPayload:
    """A request's images in prompt order, and (M-RoPE families) the prompt's rope positions.

    `positions` [3, len(prompt)] int64: the three position streams of every prompt token (None: a
    family with ordinary positions); `rope_delta`: what a token past the prompt adds to its own
    position (decode runs ordinary RoPE at position + rope_delta); `bidirectional` (Gemma 3):
    each image's tokens attend to each other, later ones too, so a prefill chunk never splits an
    image (`chunk_tokens`) and its attention gets the images' ranges (AttentionMetadata.image_blocks)."""

    items: tuple[MmItem, ...]
    positions: np.ndarray | None = None
    rope_delta: int = 0
    bidirectional: bool = False

    def overlapping(self, start: int, end: int) -> list[MmItem]:
        """The images with a token in [start, end)."""
        return [it for it in self.items if it.offset < end and it.end > start]

    def chunk_tokens(self, start: int, n: int) -> int:
        """How many of the `n` tokens from `start` a prefill chunk may take: all of them, unless
        they end inside a bidirectional image, then up to that image (0 when the chunk would
        start with it: it waits for a budget it fits in)."""
        if not self.bidirectional:
            return n
        end = start + n
        for it in self.items:
            if it.offset < end < it.end:
                return max(0, it.offset - start)
        return n

    def blocks(self, start: int, end: int) -> tuple[tuple[int, int], ...]:
        """The [offset, end) ranges of the bidirectional images with a token in [start, end)."""
        if not self.bidirectional:
            return ()
        return tuple((it.offset, it.end) for it in self.overlapping(start, end))
