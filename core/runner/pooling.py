"""Embedding sequences' hidden states -> one vector each (core/embedding.py says what is pooled).

Decoders (`ChunkPooler`): an embedding prompt runs as prefill chunks over one or more steps, so
mean and cls pooling carry state between its chunks (the running sum / the first row), kept per
sequence until its last chunk; lasttoken reads only the last chunk's last row (the row a generation
would sample). Encoders (`pool_padded`): a whole padded batch [B, S, H] at once.
Then the vectors are normalized on the device (`Pooling.normalize`) and `Pooled.to_host` copies
them once per step and applies each request's `dimensions` (truncate, renormalize) on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from rillet.core.embedding import Pooling, PoolingMode
from rillet.core.runner.step_inputs import PoolRows
from rillet.core.sequence import Seq


@dataclass(slots=True)
class Pooled:
    """One step's finished vectors, still on the device."""

    vectors: torch.Tensor  # [P, H] float32, normalized when the model's pooling says so
    dims: list[int | None]  # [P]: each request's `dimensions`

    def to_host(self) -> list[bytes]:
        """Little-endian float32 bytes per vector (SeqDelta.embedding); waits for the device."""
        host = self.vectors.cpu().numpy()
        out = []
        for row, d in zip(host, self.dims, strict=True):
            if d is not None and d < row.shape[0]:
                row = row[:d]
                row = row / max(float(np.linalg.norm(row)), 1e-12)
            out.append(row.astype("<f4", copy=False).tobytes())
        return out


def finish(vectors: torch.Tensor, seqs: list[Seq], pooling: Pooling) -> Pooled:
    """vectors [P, H] (any float dtype) of `seqs` -> float32, normalized as the model says."""
    v = vectors.float()
    if pooling.normalize:
        v = F.normalize(v, p=2.0, dim=-1)  # eps 1e-12, as sentence-transformers' Normalize
    return Pooled(v, [s.embed.dimensions if s.embed is not None else None for s in seqs])


class ChunkPooler:
    """Pools a decoder's embedding sequences chunk by chunk. Engine thread only."""

    def __init__(self, pooling: Pooling) -> None:
        self.pooling = pooling
        # seq_id -> [H] float32: the running sum of rows (mean) or the first row (cls), between
        # a sequence's chunks. A chunk at position 0 starts it afresh (preempted sequences recompute).
        self._carry: dict[int, torch.Tensor] = {}

    def take(self, hidden: torch.Tensor, pool: list[PoolRows]) -> tuple[list[Seq], Pooled | None]:
        """hidden [T, H]: the step's final hidden states -> (the sequences finished, their vectors)."""
        mode = self.pooling.mode
        seqs: list[Seq] = []
        vectors: list[torch.Tensor] = []
        for p in pool:
            v = self._fold(mode, hidden, p)
            if p.last:
                seqs.append(p.seq)
                vectors.append(v)
        if not seqs:
            return seqs, None
        return seqs, finish(torch.stack(vectors), seqs, self.pooling)

    def _fold(self, mode: PoolingMode, hidden: torch.Tensor, p: PoolRows) -> torch.Tensor:
        if mode == "lasttoken":
            return hidden[p.first + p.count - 1]
        sid = p.seq.seq_id
        carried = self._carry.pop(sid, None) if p.start else None
        if mode == "mean":
            total = hidden[p.first : p.first + p.count].sum(0, dtype=torch.float32)  # [H]
            if carried is not None:
                total = total + carried
            if p.last:
                return total / p.seq.prompt_len
            self._carry[sid] = total
            return total
        first = hidden[p.first].float() if carried is None else carried  # cls
        if not p.last:
            self._carry[sid] = first
        return first

    def release(self, seq_id: int) -> None:
        self._carry.pop(seq_id, None)


def pool_padded(
    hidden: torch.Tensor,  # [B, S, H]
    lengths: torch.Tensor,  # [B] int64: real tokens per row (right padding)
    mask: torch.Tensor | None,  # [B, S] bool: True on real tokens; None: no padding
    mode: PoolingMode,
) -> torch.Tensor:  # [B, H]
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]
    if mask is None:
        summed = hidden.sum(1, dtype=torch.float32)
    else:
        summed = (hidden * mask.unsqueeze(-1).to(hidden.dtype)).sum(1, dtype=torch.float32)
    return summed / lengths.unsqueeze(-1).to(torch.float32)
