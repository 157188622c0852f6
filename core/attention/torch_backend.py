"""Paged attention in plain PyTorch (SDPA): the CPU backend and the reference for the others.

Per step: write the new K/V at `slot_mapping`, then attend in up to three groups, all slices of the
flat batch (prefills first, decodes last, per AttentionMetadata):
  - fresh prefills (q_len == seq_len): causal SDPA over this step's own k/v, the cache is not read;
  - continued prefills (chunks of a partly cached prompt): gather the context from the cache, SDPA
    with a bottom-right-aligned causal mask (query i sits at position seq_len - q_len + i);
  - decodes (q_len 1): gather every context once, padded to the longest, one masked SDPA for all.
    GQA is free here: q viewed as [B, Hkv, G, D] puts a kv head's G query heads on the query axis.
Rows past query_start[B] (batch padding, slot -1) are left zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from rillet.core.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    DecodeMetadata,
    StepMetadata,
    VerifyMetadata,
)
from rillet.core.attention.paged_decode import paged_decode_attention
from rillet.core.attention.paged_verify import paged_verify_attention


def write_kv(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [N, bs, Hkv, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64, -1 = padding row
) -> None:
    # Padding rows are sent to slot 0, inside the reserved dummy block that no sequence reads
    # unmasked; this keeps the write one index_copy_ with no data-dependent shapes (graph-safe).
    slots = slot_mapping.clamp(min=0)
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))


def gather_context(
    cache: torch.Tensor,  # [N, bs, Hkv, D]
    block_tables: torch.Tensor,  # [B, nblk]
) -> torch.Tensor:  # [B, Hkv, nblk * bs, D]
    # index_select, not cache[block_tables]: advanced indexing is ~100x slower on CPU here
    b, n = block_tables.shape
    blocks = cache.index_select(0, block_tables.reshape(-1))  # [B * nblk, bs, Hkv, D]
    # contiguous: SDPA and matmul on the transposed view run ~80x slower on CPU (measured)
    return blocks.view(b, n * cache.shape[1], *cache.shape[2:]).transpose(1, 2).contiguous()


class TorchAttentionBackend(AttentionBackend):
    """`trim_decode`: gather decode contexts only up to the longest one (host-side, from
    seq_lens_cpu). Default: on unless the tensors are on CUDA, where a captured graph must not bake
    in a width taken from host data (the capture-time batch is all padding, seq_len 1)."""

    name = "torch"
    # decode steps given a DecodeMetadata take the graph-safe path (attention/paged_decode.py):
    # compiled on CPU, and capturable into CUDA graphs (the fallback when flashinfer is absent)
    graph_safe_decode = True
    supports_cuda_graphs = True

    def __init__(self, trim_decode: bool | None = None) -> None:
        self.trim_decode = trim_decode

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        meta: StepMetadata,
        scale: float,
    ) -> torch.Tensor:  # [T, Hq, D]
        if isinstance(meta, DecodeMetadata):  # the graph-safe decode step (compiled / captured)
            return paged_decode_attention(q, k, v, k_cache, v_cache, meta, scale)
        if isinstance(meta, VerifyMetadata):  # the graph-safe speculative verify step
            return paged_verify_attention(q, k, v, k_cache, v_cache, meta, scale)
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        qlens, slens = meta.query_lens_cpu, meta.seq_lens_cpu
        n_pre = meta.num_prefills
        used = sum(qlens)
        if n_pre == 0 and used == q.shape[0]:
            return self._decode(q, k_cache, v_cache, meta, 0, scale)
        out = torch.zeros_like(q) if used < q.shape[0] else torch.empty_like(q)
        start = 0
        for b in range(n_pre):
            end = start + qlens[b]
            if qlens[b] == slens[b]:
                out[start:end] = _causal(q[start:end], k[start:end], v[start:end], scale)
            else:
                out[start:end] = self._chunk(q[start:end], k_cache, v_cache, meta, b, scale)
            start = end
        if n_pre < meta.num_seqs:
            out[start:used] = self._decode(q[start:used], k_cache, v_cache, meta, n_pre, scale)
        return out

    def _chunk(
        self,
        q: torch.Tensor,  # [L, Hq, D]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        b: int,
        scale: float,
    ) -> torch.Tensor:  # [L, Hq, D]
        s, n = meta.seq_lens_cpu[b], q.shape[0]
        nblk = -(-s // meta.block_size)
        table = meta.block_tables[b : b + 1, :nblk]
        kc = gather_context(k_cache, table)[:, :, :s]  # [1, Hkv, S, D]
        vc = gather_context(v_cache, table)[:, :, :s]
        qpos = torch.arange(s - n, s, device=q.device)
        mask = torch.arange(s, device=q.device)[None, :] <= qpos[:, None]  # [L, S]
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], kc, vc, attn_mask=mask, scale=scale, enable_gqa=True
        )  # [1, Hq, L, D]
        return o[0].transpose(0, 1)

    def _decode(
        self,
        q: torch.Tensor,  # [B', Hq, D], one row per decode sequence
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        first: int,  # index of the first decode sequence in the batch
        scale: float,
    ) -> torch.Tensor:  # [B', Hq, D]
        table = meta.block_tables[first:]
        if self.trim_decode if self.trim_decode is not None else not q.is_cuda:
            table = table[:, : max(1, -(-max(meta.seq_lens_cpu[first:]) // meta.block_size))]
        kc = gather_context(k_cache, table)  # [B', Hkv, S, D]
        vc = gather_context(v_cache, table)
        bsz, hkv, s, d = kc.shape
        # clamp: a padding sequence (seq_len 0) still sees one (dummy) key, so softmax stays finite
        seq_lens = meta.seq_lens[first:].clamp(min=1)
        mask = torch.arange(s, device=q.device)[None, :] < seq_lens[:, None]  # [B', S]
        qg = q.reshape(bsz, hkv, -1, d)  # [B', Hkv, G, D]: query heads grouped by their kv head
        o = F.scaled_dot_product_attention(qg, kc, vc, attn_mask=mask[:, None, None, :], scale=scale)
        return o.reshape(bsz, -1, d)


def _causal(
    q: torch.Tensor,  # [L, Hq, D]
    k: torch.Tensor,  # [L, Hkv, D]
    v: torch.Tensor,
    scale: float,
) -> torch.Tensor:  # [L, Hq, D]
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        is_causal=True,
        scale=scale,
        enable_gqa=True,
    )
    return o[0].transpose(0, 1)
