"""Image embeddings by the image's content hash, least recently used first out, within a byte
budget (vision.encoder_cache_mb): a repeated image is encoded once, and a prefill cut into chunks
slices one image's embeddings instead of encoding it per chunk. Engine thread only."""

from __future__ import annotations

from collections import OrderedDict

import torch


class EncoderCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.used = 0
        self._entries: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    def get(self, key: bytes) -> torch.Tensor | None:
        t = self._entries.get(key)
        if t is not None:
            self._entries.move_to_end(key)
        return t

    def put(self, key: bytes, t: torch.Tensor) -> None:
        size = t.numel() * t.element_size()
        if size > self.capacity or key in self._entries:
            return
        while self.used + size > self.capacity:
            _, old = self._entries.popitem(last=False)
            self.used -= old.numel() * old.element_size()
        self._entries[key] = t
        self.used += size

    def __len__(self) -> int:
        return len(self._entries)
