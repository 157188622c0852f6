"""Paged attention in plain PyTorch (SDPA): the CPU backend and the reference for the others.

Per step: write the new K/V at `slot_mapping`, then attend in up to three groups, all slices of the
flat batch (prefills first, decodes last, per AttentionMetadata):
  - fresh prefills (q_len == seq_len): causal SDPA over this step's own k/v as the cache stores
    them (`stored`: what a later chunk or a prefix-cache hit reads back), the cache is not read;
  - continued prefills (chunks of a partly cached prompt): gather the context from the cache, SDPA
    with a bottom-right-aligned causal mask (query i sits at position seq_len - q_len + i);
  - decodes (q_len 1): gather every context once, padded to the longest, one masked SDPA for all.
    GQA is free here: q viewed as [B, Hkv, G, D] puts a kv head's G query heads on the query axis.
Rows past query_start[B] (batch padding, slot -1) are left zero. An int8 pool (`scales` given)
holds K/V rotated (attention/kv_cache.py): the query is rotated in and the output back, once a step.
"""

from __future__ import annotations

from typing import NamedTuple, TypedDict

import torch
import torch.nn.functional as F
from rillet.core.attention import cpu_kernel
from rillet.core.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    DecodeMetadata,
    StepMetadata,
    VerifyMetadata,
)
from rillet.core.attention.kv_cache import Scales, gather, rotate, rotated, stored, write_rows
from rillet.core.attention.paged_decode import paged_decode_attention
from rillet.core.attention.paged_verify import paged_verify_attention


def write_kv(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [N, bs, Hkv, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64, -1 = padding row
    scales: Scales | None = None,  # int8 pools: [N, bs, Hkv] each
) -> None:
    # Padding rows are sent to slot 0, inside the reserved dummy block that no sequence reads
    # unmasked; this keeps the write one index_copy_ with no data-dependent shapes (graph-safe).
    slots = slot_mapping.clamp(min=0)
    ks, vs = scales if scales is not None else (None, None)
    write_rows(k, k_cache, ks, slots)
    write_rows(v, v_cache, vs, slots)


def gather_context(
    cache: torch.Tensor,  # [N, bs, Hkv, D]
    block_tables: torch.Tensor,  # [B, nblk]
    scale: torch.Tensor | None = None,  # [N, bs, Hkv] (int8 pools)
    dtype: torch.dtype | None = None,  # of the result; None = the cache's
) -> torch.Tensor:  # [B, Hkv, nblk * bs, D]
    blocks = gather(cache, scale, block_tables, dtype or cache.dtype)  # [B, nblk * bs, Hkv, D]
    # contiguous: SDPA and matmul on the transposed view run ~80x slower on CPU (measured)
    return blocks.transpose(1, 2).contiguous()


class _GraphOpts(TypedDict):
    window: int | None
    softcap: float | None
    scales: Scales | None
    kernel: bool


class TorchAttentionBackend(AttentionBackend):
    """`trim_decode`: gather decode contexts only up to the longest one (host-side, from
    seq_lens_cpu). Default: on unless the tensors are on CUDA, where a captured graph must not bake
    in a width taken from host data (the capture-time batch is all padding, seq_len 1).
    `paged_kernel`: decode and verify steps attend through rillet's CPU kernel (cpu_kernel.py),
    compiled or eager; prefills keep SDPA."""

    name = "torch"
    # decode steps given a DecodeMetadata take the graph-safe path (attention/paged_decode.py):
    # compiled on CPU, and capturable into CUDA graphs (the fallback when flashinfer is absent)
    graph_safe_decode = True
    supports_cuda_graphs = True
    image_blocks = True

    def __init__(self, trim_decode: bool | None = None, paged_kernel: bool = False) -> None:
        self.trim_decode = trim_decode
        self.paged_kernel = paged_kernel
        self.variant = cpu_kernel.VARIANT if paged_kernel else ""

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        meta: StepMetadata,
        scale: float,
        *,
        window: int | None = None,
        softcap: float | None = None,
        scales: Scales | None = None,
    ) -> torch.Tensor:  # [T, Hq, D]
        graph = _GraphOpts(window=window, softcap=softcap, scales=scales, kernel=self.paged_kernel)
        if isinstance(meta, DecodeMetadata):  # the graph-safe decode step (compiled / captured)
            return paged_decode_attention(q, k, v, k_cache, v_cache, meta, scale, **graph)
        if isinstance(meta, VerifyMetadata):  # the graph-safe speculative verify step
            return paged_verify_attention(q, k, v, k_cache, v_cache, meta, scale, **graph)
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping, scales)
        opts = _Opts(scale, window, softcap, scales)
        if rotated(scales):  # an int8 pool holds K/V rotated: attend in its space (kv_cache.py)
            return rotate(self._flat(rotate(q), k, v, k_cache, v_cache, meta, opts))
        return self._flat(q, k, v, k_cache, v_cache, meta, opts)

    def _flat(
        self,
        q: torch.Tensor,  # [T, Hq, D], in the cache's space
        k: torch.Tensor,  # [T, Hkv, D], as given (already written)
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        opts: _Opts,
    ) -> torch.Tensor:  # [T, Hq, D]
        qlens, slens = meta.query_lens_cpu, meta.seq_lens_cpu
        n_pre = meta.num_prefills
        used = sum(qlens)
        if n_pre == 0 and used == q.shape[0]:
            return self._decode(q, k_cache, v_cache, meta, 0, opts)
        out = torch.zeros_like(q) if used < q.shape[0] else torch.empty_like(q)
        start = 0
        for b in range(n_pre):
            end = start + qlens[b]
            blocks = meta.image_blocks[b] if meta.image_blocks is not None else ()
            opts_b = opts._replace(blocks=blocks) if blocks else opts
            if qlens[b] == slens[b]:  # K/V as the cache holds them, as a later chunk reads them
                kb, vb = (stored(x[start:end], k_cache.dtype) for x in (k, v))
                out[start:end] = _causal(q[start:end], kb, vb, opts_b)
            else:
                out[start:end] = self._chunk(q[start:end], k_cache, v_cache, meta, b, opts_b)
            start = end
        if n_pre < meta.num_seqs:
            out[start:used] = self._decode(q[start:used], k_cache, v_cache, meta, n_pre, opts)
        return out

    def _chunk(
        self,
        q: torch.Tensor,  # [L, Hq, D]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        b: int,
        opts: _Opts,
    ) -> torch.Tensor:  # [L, Hq, D]
        s, n, bs = meta.seq_lens_cpu[b], q.shape[0], meta.block_size
        nblk = -(-s // bs)
        # a sliding window reaches back to the first query's position - window + 1
        first = 0 if opts.window is None else max(0, s - n - opts.window + 1) // bs
        table = meta.block_tables[b : b + 1, first:nblk]
        ks, vs = opts.cache_scales or (None, None)
        kc = gather_context(k_cache, table, ks, q.dtype)[:, :, : s - first * bs]  # [1, Hkv, S', D]
        vc = gather_context(v_cache, table, vs, q.dtype)[:, :, : s - first * bs]
        qpos = torch.arange(s - n, s, device=q.device)
        kpos = torch.arange(first * bs, s, device=q.device)
        mask = _mask(qpos, kpos, opts)  # [L, S']
        return _attend(q.transpose(0, 1)[None], kc, vc, mask, opts)[0].transpose(0, 1)

    def _decode(
        self,
        q: torch.Tensor,  # [B', Hq, D], one row per decode sequence
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        first: int,  # index of the first decode sequence in the batch
        opts: _Opts,
    ) -> torch.Tensor:  # [B', Hq, D]
        table = meta.block_tables[first:]
        if self.trim_decode if self.trim_decode is not None else not q.is_cuda:
            table = table[:, : max(1, -(-max(meta.seq_lens_cpu[first:]) // meta.block_size))]
        ks, vs = opts.cache_scales or (None, None)
        kc = gather_context(k_cache, table, ks, q.dtype)  # [B', Hkv, S, D]
        vc = gather_context(v_cache, table, vs, q.dtype)
        bsz, hkv, s, d = kc.shape
        # clamp: a padding sequence (seq_len 0) still sees one (dummy) key, so softmax stays finite
        seq_lens = meta.seq_lens[first:].clamp(min=1)
        pos = torch.arange(s, device=q.device)[None, :]
        mask = pos < seq_lens[:, None]  # [B', S]
        if opts.window is not None:
            mask &= pos >= seq_lens[:, None] - opts.window
        qg = q.reshape(bsz, hkv, -1, d)  # [B', Hkv, G, D]: query heads grouped by their kv head
        return _attend(qg, kc, vc, mask[:, None, None, :], opts).reshape(bsz, -1, d)


class _Opts(NamedTuple):
    scale: float
    window: int | None
    softcap: float | None
    cache_scales: Scales | None = None  # the layer's int8 scales
    blocks: tuple[tuple[int, int], ...] = ()  # the sequence's bidirectional position ranges


def _mask(qpos: torch.Tensor, kpos: torch.Tensor, opts: _Opts) -> torch.Tensor:
    """[L, S] bool, True = attend: causal, or both in one image block; then the window."""
    mask = kpos[None, :] <= qpos[:, None]
    if opts.blocks:
        mask |= _block_ids(qpos, opts.blocks)[:, None] == _block_ids(kpos, opts.blocks)[None, :]
    if opts.window is not None:
        mask &= kpos[None, :] > qpos[:, None] - opts.window
    return mask


def _block_ids(pos: torch.Tensor, blocks: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """Each position's block index; outside every block a distinct negative id (never equal)."""
    ids = -1 - pos  # distinct per position: text tokens match no other token
    for i, (lo, hi) in enumerate(blocks):
        ids = torch.where((pos >= lo) & (pos < hi), i, ids)
    return ids


def _causal(
    q: torch.Tensor,  # [L, Hq, D]
    k: torch.Tensor,  # [L, Hkv, D]
    v: torch.Tensor,
    opts: _Opts,
) -> torch.Tensor:  # [L, Hq, D]
    qt, kt, vt = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    n = q.shape[0]
    if opts.window is not None and n <= opts.window:  # the window reaches back to position 0
        opts = opts._replace(window=None)
    if opts.window is None and opts.softcap is None and not opts.blocks:
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=opts.scale, enable_gqa=True)
    else:
        pos = torch.arange(n, device=q.device)
        o = _attend(qt, kt, vt, _mask(pos, pos, opts), opts)  # [L, L]
    return o[0].transpose(0, 1)


def _attend(
    q: torch.Tensor,  # [B, Hq, L, D]
    k: torch.Tensor,  # [B, Hkv, S, D]
    v: torch.Tensor,
    mask: torch.Tensor,  # bool, broadcast to [B, Hq, L, S]: True = attend
    opts: _Opts,
) -> torch.Tensor:  # [B, Hq, L, D]
    if opts.softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=opts.scale, enable_gqa=True)
    return _explicit(q, k, v, mask, opts.scale, opts.softcap)


def _explicit(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float
) -> torch.Tensor:  # [B, Hq, L, D]: scores, soft-cap, mask, float32 softmax, weighted values
    g = q.shape[1] // k.shape[1]
    if g > 1:  # query head h reads kv head h // g
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
