"""Runs an encoder's embedding steps: every sequence whole, padded into [B, S], no KV cache.

The scheduler admits encoder sequences whole (core/engine/scheduler.py), so a step's batch is a set
of complete prompts. They are sorted by length and cut into groups whose padding stays small (a
group's padded tokens are at most `_MAX_PADDING` x its real ones), one forward per group; each
sequence's vector is pooled from its rows, normalized, and handed back like a sampled step's tokens.
"""

from __future__ import annotations

import array
from dataclasses import dataclass

import torch
from rillet.core.embedding import Pooling
from rillet.core.engine.scheduler import ScheduledBatch
from rillet.core.model.encoder import EncoderModel
from rillet.core.runner.base import InflightStep, SampleResult
from rillet.core.runner.pooling import Pooled, finish, pool_padded
from rillet.core.sequence import Seq

_MAX_PADDING = 1.25


@dataclass
class _Encoded:
    seqs: list[Seq]  # pooled, none sampled
    pooled: list[Pooled]  # per group, in the order of seqs

    def ready(self) -> bool:
        return False  # not known before its wait, which copies the vectors to the host

    def wait(self) -> SampleResult:
        vectors = [v for p in self.pooled for v in p.to_host()]
        return SampleResult([], [], vectors)


def length_groups(seqs: list[Seq]) -> list[list[Seq]]:
    """Longest first; a group grows while its padded size stays within _MAX_PADDING of its tokens."""
    groups: list[list[Seq]] = []
    tokens = 0
    for seq in sorted(seqs, key=lambda s: s.prompt_len, reverse=True):
        if groups:
            group = groups[-1]
            width = group[0].prompt_len
            if (len(group) + 1) * width <= _MAX_PADDING * (tokens + seq.prompt_len):
                group.append(seq)
                tokens += seq.prompt_len
                continue
        groups.append([seq])
        tokens = seq.prompt_len
    return groups


class EncoderRunner:
    def __init__(self, model: EncoderModel, pooling: Pooling, device: torch.device) -> None:
        self.model = model
        self.pooling = pooling
        self.device = device

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch) -> InflightStep:
        for seq, n in zip(batch.seqs, batch.num_new, strict=True):
            if seq.embed is None or seq.num_computed != 0 or n != seq.prompt_len:
                raise RuntimeError("an encoder runs whole embedding prompts only")
        groups = length_groups(batch.seqs)
        return _Encoded([s for g in groups for s in g], [self._encode(g) for g in groups])

    def _encode(self, seqs: list[Seq]) -> Pooled:
        width = seqs[0].prompt_len  # the longest: groups are sorted
        flat = array.array("q")
        for s in seqs:
            flat.extend(s.prompt_ids)
            flat.extend([0] * (width - s.prompt_len))
        ids = torch.frombuffer(flat, dtype=torch.int64).view(len(seqs), width).to(self.device)
        lengths = torch.tensor([s.prompt_len for s in seqs], dtype=torch.int64, device=self.device)
        mask = None
        if seqs[-1].prompt_len < width:  # padded (the shortest is last): attention and mean skip it
            mask = torch.arange(width, device=self.device) < lengths[:, None]  # [B, S]
        hidden = self.model(ids, mask)  # [B, S, H]
        return finish(pool_padded(hidden, lengths, mask, self.pooling.mode), seqs, self.pooling)

    def release(self, seq: Seq) -> None:
        pass  # nothing is kept between steps

    def poll(self) -> None:
        pass  # no background work

    def close(self) -> None:
        pass
