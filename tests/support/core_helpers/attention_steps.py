"""Attention steps for the flashinfer backend's tests: the geometry (block size, head counts, head
size), `Step` (random sequences over a shared paged cache, with a step's AttentionMetadata, q/k/v
and cache), the CPU backend under test (`backend`) and one step run through it and through the
torch backend (`run_both`)."""

from __future__ import annotations

from typing import Any

import torch
from rillet.core.attention.base import AttentionMetadata
from rillet.core.attention.flashinfer_backend import FlashInferAttentionBackend
from rillet.core.attention.torch_backend import TorchAttentionBackend

BS = 4  # block (page) size
HQ, HKV, D = 4, 2, 8


def backend(**kw: Any) -> FlashInferAttentionBackend:
    return FlashInferAttentionBackend(HQ, HKV, D, BS, torch.float32, "cpu", workspace_bytes=1024, **kw)


class Step:
    """Random sequences over a shared paged cache; builds AttentionMetadata for a step."""

    def __init__(
        self, cached: list[int], new: list[int], seed: int, width: int = 6, head_dim: int = D
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        perm = (torch.randperm(40, generator=g) + 1).tolist()  # distinct blocks, never 0
        self.tables = [perm[i * width : (i + 1) * width] for i in range(len(cached))]
        seq_lens = [c + n for c, n in zip(cached, new, strict=True)]
        slots = [
            t[p // BS] * BS + p % BS
            for t, c, s in zip(self.tables, cached, seq_lens, strict=True)
            for p in range(c, s)
        ]
        self.meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots),
            query_start=torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=torch.tensor(self.tables, dtype=torch.int32),
            query_lens_cpu=list(new),
            seq_lens_cpu=seq_lens,
            block_size=BS,
            num_prefills=sum(1 for c, n in zip(cached, new, strict=True) if n > 1 or c == 0),
        )
        t = sum(new)
        self.head_dim = head_dim
        self.q, self.k, self.v = (torch.randn(t, h, head_dim, generator=g) for h in (HQ, HKV, HKV))
        k_cache, v_cache = (torch.randn(41, BS, HKV, head_dim, generator=g) for _ in range(2))
        self.cache = (k_cache, v_cache)


def run_both(step: Step, backend: FlashInferAttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
    kc, vc = (c.clone() for c in step.cache)
    scale = step.head_dim**-0.5
    ref = TorchAttentionBackend().forward(step.q, step.k, step.v, kc, vc, step.meta, scale)
    kf, vf = (c.clone() for c in step.cache)
    backend.begin_step(step.meta)
    got = backend.forward(step.q, step.k, step.v, kf, vf, step.meta, scale)
    assert torch.equal(kf, kc) and torch.equal(vf, vc)  # the same K/V written at the same slots
    return got, ref
