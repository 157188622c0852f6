"""A step's image inputs, built beside the token inputs (core/runner/input_builder.py) in the same
token order (prefill chunks, then decodes: step_inputs.py):

- every image a prefill chunk overlaps is encoded (the step's missing images in one tower batch,
  the rest from the encoder cache) and the chunk's slice of its embeddings replaces the image
  tokens' rows; a chunk boundary inside an image slices the cached embeddings;
- M-RoPE positions [3, T] for a step with an image prompt's chunk (its prompt tokens take the
  payload's streams, every other token position + its sequence's delta in all three), else the
  flat positions + each sequence's delta (decode steps: the compiled step's only change)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from rillet.core.engine.scheduler import ScheduledBatch
from rillet.core.model.decoder import MmEmbeds
from rillet.core.runner.step_inputs import split_batch
from rillet.core.sequence import Seq
from rillet.core.vision.encoder_cache import EncoderCache
from rillet.core.vision.family import VisionTower
from rillet.core.vision.payload import MmItem


@dataclass
class VisionStats:
    tower_runs: int = 0  # tower forwards
    images_encoded: int = 0  # images through the tower (a cache hit is not one)
    cache_hits: int = 0  # images a chunk took from the encoder cache


class VisionStep:
    def __init__(self, tower: VisionTower, cache: EncoderCache, device: torch.device, mrope: bool) -> None:
        self.tower = tower
        self.cache = cache
        self.device = device
        self.mrope = mrope
        self.stats = VisionStats()

    def inputs(self, batch: ScheduledBatch, positions: torch.Tensor) -> tuple[torch.Tensor, MmEmbeds | None]:
        """(the flat positions RoPE sees, the prefill's image inputs or None)."""
        chunks, decodes = split_batch(batch)
        if not any(s.mm is not None for s in batch.seqs):
            return positions, None
        if not chunks:  # a decode step: one token per row, each at position + its delta
            deltas = torch.tensor([s.rope_delta for s in decodes], dtype=torch.int64)
            return positions + deltas.to(self.device), None
        order = chunks + [(s, 1) for s in decodes]
        flat = np.concatenate([_flat(s, n) for s, n in order])
        rope = torch.from_numpy(flat).to(self.device)
        images = [(s, n) for s, n in chunks if s.mm is not None and s.num_computed < s.prompt_len]
        if not images:
            return rope, None
        rows, embeds = self._embeds(chunks)
        streams = None
        if self.mrope:
            three = np.concatenate([_streams(s, n) for s, n in order], axis=1)
            streams = torch.from_numpy(three).to(self.device)
        return rope, MmEmbeds(rows, embeds, streams)

    def image_blocks(self, batch: ScheduledBatch) -> list[tuple[tuple[int, int], ...]] | None:
        """AttentionMetadata.image_blocks of the step (its sequences in the metadata's order):
        each prefill chunk's bidirectional images; None when the step has none."""
        chunks, decodes = split_batch(batch)
        blocks = [s.mm.blocks(s.num_computed, s.num_computed + n) if s.mm else () for s, n in chunks]
        if not any(blocks):
            return None
        return blocks + [()] * len(decodes)

    def _embeds(self, chunks: list[tuple[Seq, int]]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        wanted: list[tuple[int, MmItem, int, int]] = []  # (step row, image, first, end) of its tokens
        at = 0
        for seq, n in chunks:
            start = seq.num_computed
            if seq.mm is not None:
                for it in seq.mm.overlapping(start, start + n):
                    lo, hi = max(start, it.offset), min(start + n, it.end)
                    wanted.append((at + lo - start, it, lo - it.offset, hi - it.offset))
            at += n
        if not wanted:
            return None, None
        got = self._encode([it for _, it, _, _ in wanted])
        rows = torch.cat([torch.arange(r, r + hi - lo) for r, _, lo, hi in wanted]).to(self.device)
        embeds = torch.cat([got[it.content_hash][lo:hi] for _, it, lo, hi in wanted])
        return rows, embeds

    def _encode(self, items: list[MmItem]) -> dict[bytes, torch.Tensor]:
        got: dict[bytes, torch.Tensor] = {}
        missing: dict[bytes, MmItem] = {}
        for it in items:
            if it.content_hash in got or it.content_hash in missing:
                continue
            hit = self.cache.get(it.content_hash)
            if hit is not None:
                got[it.content_hash] = hit
                self.stats.cache_hits += 1
            else:
                missing[it.content_hash] = it
        if missing:
            outs = self.tower.encode(list(missing.values()))
            self.stats.tower_runs += 1
            self.stats.images_encoded += len(missing)
            for key, emb in zip(missing, outs, strict=True):
                emb = emb.to(self.device)
                self.cache.put(key, emb)
                got[key] = emb
        return got


def _flat(seq: Seq, n: int) -> np.ndarray:
    start = seq.num_computed
    return np.arange(start, start + n, dtype=np.int64) + seq.rope_delta


def _streams(seq: Seq, n: int) -> np.ndarray:
    """[3, n]: the payload's streams for prompt tokens, position + delta past the prompt."""
    start = seq.num_computed
    out = np.repeat(_flat(seq, n)[None], 3, axis=0)
    mm = seq.mm
    if mm is not None and mm.positions is not None and start < mm.positions.shape[1]:
        end = min(start + n, mm.positions.shape[1])
        out[:, : end - start] = mm.positions[:, start:end]
    return out
