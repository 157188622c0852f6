"""The batch-invariant attention backend of deterministic mode (engine.deterministic, CPU).

Same paged cache and metadata as the torch backend, but every row goes through invariant_ops.py:
a token's attention output has the same bits whether it is computed in a fresh prompt, in a chunk
after a prefix-cache hit or a recomputation, or as a decode row among any others. Prefills read
their keys back from the cache after writing them, as decodes do, so both see the cache's values.
Sliding windows and soft-capping are masks and elementwise maps of the same reduction.

Eager only (build.py serves deterministic mode without the compiled step): the compiled CPU step's
fused kernels give other bits than these, and a server that switched mid-life would not be
deterministic. A DecodeMetadata forward is supported all the same (the graph-safe interface).
An int8 pool is supported: its scales are per token, so what a row reads back does not depend on
the batch either.
"""

from __future__ import annotations

import torch
from rillet.core.attention.base import AttentionBackend, AttentionMetadata, DecodeMetadata, VerifyMetadata
from rillet.core.attention.invariant_ops import decode_attention, gather_kv, prefill_attention
from rillet.core.attention.kv_cache import Scales, rotate, rotated
from rillet.core.attention.paged_decode import write_decode_kv
from rillet.core.attention.torch_backend import write_kv
from rillet.core.determinism.rows import RowPadding


class InvariantAttentionBackend(AttentionBackend):
    name = "invariant"
    graph_safe_decode = False  # never compiled: see the module docstring
    supports_cuda_graphs = False

    def __init__(self, rows: RowPadding) -> None:
        self.rows = rows

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata | DecodeMetadata | VerifyMetadata,
        scale: float,
        *,
        window: int | None = None,
        softcap: float | None = None,
        scales: Scales | None = None,
    ) -> torch.Tensor:  # [T, Hq, D]
        if not rotated(scales):
            return self._forward(q, k, v, k_cache, v_cache, meta, scale, window, softcap, scales)
        # an int8 pool holds K/V rotated: attend in its space (kv_cache.py); elementwise per row
        o = self._forward(rotate(q), k, v, k_cache, v_cache, meta, scale, window, softcap, scales)
        return rotate(o)

    def _forward(
        self,
        q: torch.Tensor,  # [T, Hq, D], in the cache's space
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata | DecodeMetadata | VerifyMetadata,
        scale: float,
        window: int | None,
        softcap: float | None,
        scales: Scales | None,
    ) -> torch.Tensor:  # [T, Hq, D]
        if isinstance(meta, VerifyMetadata):  # never planned: not graph-safe, verify runs as chunks
            raise TypeError("the invariant backend runs speculative verify rows as prefill chunks")
        if isinstance(meta, DecodeMetadata):
            write_decode_kv(k, v, k_cache, v_cache, meta.slot_mapping, scales)
            table, lens = meta.block_tables, meta.seq_lens
            o = decode_attention(q, k_cache, v_cache, table, lens, self.rows, scale, window, softcap, scales)
            return o.to(q.dtype)
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping, scales)
        qlens, slens, bs = meta.query_lens_cpu, meta.seq_lens_cpu, meta.block_size
        used = sum(qlens)
        out = torch.zeros_like(q) if used < q.shape[0] else torch.empty_like(q)
        start = 0
        for b in range(meta.num_prefills):
            end, s = start + qlens[b], slens[b]
            kc, v1 = gather_kv(k_cache, v_cache, meta.block_tables[b : b + 1, : -(-s // bs)], s, scales)
            out[start:end] = prefill_attention(
                q[start:end], kc[0], v1[0], s, self.rows, scale, window, softcap
            )
            start = end
        if meta.num_prefills < meta.num_seqs:
            first = meta.num_prefills
            width = max(1, -(-max(slens[first:]) // bs))  # the longest decode context, whole blocks
            out[start:used] = decode_attention(
                q[start:used],
                k_cache,
                v_cache,
                meta.block_tables[first:, :width],
                meta.seq_lens[first:],
                self.rows,
                scale,
                window,
                softcap,
                scales,
            )
        return out
