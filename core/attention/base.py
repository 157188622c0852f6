"""The attention backend interface and the per-step metadata every backend reads.

A forward runs over a flat batch of T new tokens from B sequences; sequence b owns query rows
query_start[b] : query_start[b+1]. Its context after this step is seq_lens[b] tokens, of which the
last (query_start[b+1] - query_start[b]) are new, so query row i of sequence b sits at position
seq_lens[b] - q_len_b + i and attends causally to positions <= that.

Per-layer options (keyword arguments of `forward`): `scale` multiplies q.k; `window` (sliding-window
layers) restricts query position p to keys at positions > p - window; `softcap` maps each score s
to softcap * tanh(s / softcap) before the mask and softmax (Gemma 2). A backend that cannot do one
raises a ValueError naming it. `AttentionMetadata.image_blocks` (Gemma 3's images) makes a query
inside a block see the whole block, later positions too: mask = (causal | same block) & window,
as transformers builds it; a block is never split across prefill chunks (its later tokens must be
in the same step), and decode rows never carry one.

KV cache layout (shared by all backends, flashinfer's "NHD"):
  k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim] per layer, in the pool's
  storage dtype (cache.dtype); an int8 pool also passes `scales` = (k_scale, v_scale)
  [num_blocks, block_size, num_kv_heads] float32. A backend writes K/V quantized as the cache is
  and dequantizes where it reads (attention/kv_cache.py); one that cannot read a dtype says so
  when it is built.
Token t of a sequence lives in block block_tables[b][t // block_size] at offset t % block_size,
i.e. flat slot block * block_size + offset. Block 0 is reserved as the dummy block: padding rows
point at it and nothing real is ever stored there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: flat cache slot each new token's K/V is written to
    query_start: torch.Tensor  # [B + 1] int32: cumulative query lengths
    seq_lens: torch.Tensor  # [B] int32: context length after this step (cached + new)
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0 (the dummy block)
    query_lens_cpu: list[int]  # [B] host copy
    seq_lens_cpu: list[int]  # [B] host copy
    block_size: int
    num_prefills: int  # sequences [0, num_prefills) have q_len > 1 or a fresh prompt; rest decode
    # per sequence: the [start, end) position ranges attended bidirectionally (Gemma 3's images:
    # a query inside one sees all of it, later tokens included); None: every sequence causal
    image_blocks: list[tuple[tuple[int, int], ...]] | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def is_decode_only(self) -> bool:
        return self.num_prefills == 0


@dataclass(frozen=True)
class DecodeMetadata:
    """A decode step's attention inputs, tensors only: what a graph-safe decode forward reads
    (attention/paged_decode.py). One query row per sequence; padding rows use slot 0, length 1."""

    slot_mapping: torch.Tensor  # [B] int64, >= 0: flat KV slot of each row's new token (pad: 0)
    seq_lens: torch.Tensor  # [B] int32, >= 1: context length after this step (pad: 1)
    block_tables: torch.Tensor  # [B, W] int32, unused columns 0 (the dummy block)


@dataclass(frozen=True)
class VerifyMetadata:
    """A verify step's attention inputs (speculative decoding), tensors only: each row feeds Q
    query tokens (its last token and its drafts, padded to Q), causal among themselves, over its
    paged context (attention/paged_verify.py). Query i of row b sits at position
    seq_lens[b] - query_lens[b] + i; queries i >= query_lens[b] are padding (slot 0, outputs unused)."""

    slot_mapping: torch.Tensor  # [B, Q] int64, >= 0 (padding: 0, the dummy block's slot)
    seq_lens: torch.Tensor  # [B] int32, >= 1: context length after this step
    query_lens: torch.Tensor  # [B] int32, 1..Q: real query tokens of each row
    block_tables: torch.Tensor  # [B, W] int32, unused columns 0


StepMetadata = AttentionMetadata | DecodeMetadata | VerifyMetadata


class AttentionBackend(ABC):
    """Writes this step's K/V into the paged cache and attends over it."""

    name: str = "base"
    # what else of this backend shapes a traced step (a saved step's key, graph_adapter.py)
    variant: str = ""
    # True when forward() reads only device tensors planned in begin_step(): safe to capture.
    supports_cuda_graphs: bool = False
    # True when forward() takes a DecodeMetadata for decode steps (tensors only, no planning), and
    # a VerifyMetadata for speculative verify steps
    graph_safe_decode: bool = False
    # True when prefill honours AttentionMetadata.image_blocks (bidirectional image tokens)
    image_blocks: bool = False

    def begin_step(self, meta: AttentionMetadata) -> None:  # noqa: B027 - optional hook
        """Called once per step before the forward, outside any CUDA graph (flashinfer's plan())."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        meta: StepMetadata,
        scale: float,
        *,
        window: int | None = None,
        softcap: float | None = None,
        scales: tuple[torch.Tensor, torch.Tensor] | None = None,  # int8 pools: [num_blocks, bs, Hkv]
    ) -> torch.Tensor:  # [T, Hq, D]
        ...
