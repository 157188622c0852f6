"""Graph-safe paged attention for decode steps, in plain torch.

One query token per row. Everything the step needs is a tensor (`DecodeMetadata`): no host
lists, no shapes taken from tensor values, no branch on the row count. So the same code runs
eager, compiled by torch.compile with `fullgraph=True` (the compiled CPU decode step) and captured
into a CUDA graph (the CUDA fallback when flashinfer is absent).

Shapes are fixed by the caller: B rows, a block table W blocks wide. A padding row points at the
dummy block 0 (slot 0, context length 1) and is masked by its length like any other row; columns
past a row's context are masked the same way, so W may be any width that covers the longest
context in the step (the full `max_blocks_per_seq` for a CUDA graph, trimmed on CPU).

Where the backend asks for it (`kernel`: a CPU with AVX-512, no int8 pool, no soft cap), eager and
compiled alike, the attention is rillet's CPU kernel over the pool in place (cpu_kernel.py).
Otherwise, compiled, it is two batched GEMMs a kv head over the gathered contexts on CPU, torch's
SDPA over them on CUDA, or (soft-capped scores) two reductions Inductor fuses the block gather
into; eager, batched matmuls.
Per-layer options are Python constants of the traced code: a sliding `window` adds
`position >= seq_len - window` to the mask, `softcap` caps the scores (cap * tanh(s / cap)) before
it. Neither branches on a tensor's value. An int8 pool's `scales` are read beside the codes and
multiplied in where the values are read (attention/kv_cache.py), traced like the rest.
"""

from __future__ import annotations

import torch
from rillet.core.attention import cpu_kernel
from rillet.core.attention.base import DecodeMetadata
from rillet.core.attention.kv_cache import Scales, gather, gather_blocks, rotate, rotated, write_rows


def write_decode_kv(
    k: torch.Tensor,  # [B, Hkv, D]
    v: torch.Tensor,  # [B, Hkv, D]
    k_cache: torch.Tensor,  # [N, bs, Hkv, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [B] int64, every entry a valid slot (padding rows: slot 0)
    scales: Scales | None = None,  # int8 pools: [N, bs, Hkv] each
) -> None:
    ks, vs = scales if scales is not None else (None, None)
    write_rows(k, k_cache, ks, slot_mapping, index_put=True)
    write_rows(v, v_cache, vs, slot_mapping, index_put=True)


def paged_decode_attention(
    q: torch.Tensor,  # [B, Hq, D]
    k: torch.Tensor,  # [B, Hkv, D]
    v: torch.Tensor,  # [B, Hkv, D]
    k_cache: torch.Tensor,  # [N, bs, Hkv, D]
    v_cache: torch.Tensor,
    meta: DecodeMetadata,
    scale: float,
    *,
    window: int | None = None,
    softcap: float | None = None,
    scales: Scales | None = None,
    kernel: bool = False,
) -> torch.Tensor:  # [B, Hq, D]
    """Writes this step's K/V, then each row attends over its first seq_lens[b] cached tokens
    (its last `window` of them for a sliding layer). `kernel`: through rillet's CPU kernel
    (cpu_kernel.py) where it serves the layer: no int8 pool, no soft-capping."""
    write_decode_kv(k, v, k_cache, v_cache, meta.slot_mapping, scales)
    if kernel and scales is None and softcap is None:
        return cpu_kernel.attend(q.unsqueeze(1), k_cache, v_cache, meta, scale, window).squeeze(1)
    if rotated(scales):  # an int8 pool holds K/V rotated: attend in its space (kv_cache.py)
        q = rotate(q)
    if torch.compiler.is_compiling():
        attend = _attend_fused if softcap is not None else _attend_gathered
    else:
        attend = _attend_matmul
    o = attend(q, k_cache, v_cache, meta, scale, window, softcap, scales)
    return rotate(o) if rotated(scales) else o


def _valid(pos: torch.Tensor, seq_lens: torch.Tensor, window: int | None) -> torch.Tensor:
    """pos [..] context positions, seq_lens shaped to broadcast against them -> keys a row reads."""
    valid = pos < seq_lens
    return valid if window is None else valid & (pos >= seq_lens - window)


def _cap(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return scores if softcap is None else torch.tanh(scores / softcap) * softcap


def _attend_fused(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [N, bs, Hkv, D]
    v_cache: torch.Tensor,
    meta: DecodeMetadata,
    scale: float,
    window: int | None,
    softcap: float | None,
    scales: Scales | None = None,
) -> torch.Tensor:  # [B, Hq, D]
    """The attention as two reductions over the context, for Inductor: it fuses the block gather
    into them, so each row's context is read once, in place from the cache. As matmuls (below) it
    would first materialise and transpose every context. No reshape merges the row and width axes
    (nor the width and block axes): such an index expression would specialise a batch of 1."""
    b, w = meta.block_tables.shape
    bs, hkv, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    ks, vs = scales if scales is not None else (None, None)
    qg = q.view(b, hkv, 1, 1, q.shape[1] // hkv, d).float()  # [B, Hkv, 1, 1, G, D]
    # [B, Hkv, W, bs, 1, D] float32 views of the gathered blocks; Inductor reads them in place
    kt = gather_blocks(k_cache, ks, meta.block_tables).view(b, w, bs, hkv, 1, d).permute(0, 3, 1, 2, 4, 5)
    vt = gather_blocks(v_cache, vs, meta.block_tables).view(b, w, bs, hkv, 1, d).permute(0, 3, 1, 2, 4, 5)
    scores = _cap((qg * kt).sum(-1) * scale, softcap)  # [B, Hkv, W, bs, G]
    pos = torch.arange(w * bs, device=q.device).view(w, bs)
    valid = _valid(pos[None], meta.seq_lens[:, None, None], window)  # [B, W, bs]
    scores = scores.masked_fill(~valid[:, None, :, :, None], float("-inf"))
    # softmax over the context (W, bs) without merging the two axes (a merge ties W to B)
    e = torch.exp(scores - scores.amax(dim=(2, 3), keepdim=True))
    p = e / e.sum(dim=(2, 3), keepdim=True)  # [B, Hkv, W, bs, G]
    o = (p[..., None] * vt).sum(dim=(2, 3))  # [B, Hkv, G, D]
    return o.to(q.dtype).reshape(b, q.shape[1], d)


def _attend_matmul(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [N, bs, Hkv, D]
    v_cache: torch.Tensor,
    meta: DecodeMetadata,
    scale: float,
    window: int | None,
    softcap: float | None,
    scales: Scales | None = None,
) -> torch.Tensor:  # [B, Hq, D]
    """Eager (and CUDA-graph capture): batched matmuls over the gathered contexts."""
    b, w = meta.block_tables.shape
    hkv, d = k_cache.shape[2], k_cache.shape[3]
    s = w * k_cache.shape[1]
    ks, vs = scales if scales is not None else (None, None)
    kc = gather(k_cache, ks, meta.block_tables, q.dtype)  # [B, S, Hkv, D]
    vc = gather(v_cache, vs, meta.block_tables, q.dtype)
    qg = q.view(b, hkv, q.shape[1] // hkv, d)  # [B, Hkv, G, D]: query heads grouped by kv head
    scores = torch.einsum("bhgd,bshd->bhgs", qg, kc).float() * scale  # [B, Hkv, G, S]
    scores = _cap(scores, softcap)
    valid = _valid(torch.arange(s, device=q.device)[None, :], meta.seq_lens[:, None], window)  # [B, S]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1).to(q.dtype)
    o = torch.einsum("bhgs,bshd->bhgd", p, vc)  # [B, Hkv, G, D]
    return o.reshape(b, q.shape[1], d)


def _attend_gathered(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [N, bs, Hkv, D]
    v_cache: torch.Tensor,
    meta: DecodeMetadata,
    scale: float,
    window: int | None,
    softcap: float | None,
    scales: Scales | None = None,
) -> torch.Tensor:  # [B, Hq, D]
    """Compiled: the valid keys as a mask (a row always has one: seq_lens >= 1), through
    attend_over_blocks as the compiled verify step's (paged_verify.py), so a verify row and a
    decode step take the same kernels. Faster than the reductions above once contexts grow."""
    b, w = meta.block_tables.shape
    d = k_cache.shape[3]
    s = w * k_cache.shape[1]
    valid = _valid(torch.arange(s, device=q.device)[None, :], meta.seq_lens[:, None], window)  # [B, S]
    qh = q.view(b, q.shape[1], 1, d)  # [B, Hq, 1, D]
    o = attend_over_blocks(qh, k_cache, v_cache, scales, meta.block_tables, valid[:, None, None, :], scale)
    return o.view(b, q.shape[1], d)  # [B, 1, Hq, D] -> [B, Hq, D]


def attend_over_blocks(
    qh: torch.Tensor,  # [B, Hq, Q, D]
    k_cache: torch.Tensor,  # [N, bs, Hkv, D]
    v_cache: torch.Tensor,
    scales: Scales | None,
    block_tables: torch.Tensor,  # [B, W]
    visible: torch.Tensor,  # [B, 1, Q, W * bs] bool: no query without a visible key
    scale: float,
) -> torch.Tensor:  # [B, Q, Hq, D] contiguous
    """Each row's blocks gathered (dequantized) head-major and attended, the query heads grouped
    over the KV heads: the compiled decode and verify steps. On CPU two batched GEMMs a kv head
    (`gemms_over_context`), on CUDA torch's fused attention; q's device is a constant of the traced
    code."""
    kc, vc = gather_head_major(k_cache, v_cache, scales, block_tables, qh.dtype)
    over = sdpa_over_context if qh.is_cuda else gemms_over_context
    return over(qh, kc, vc, visible, scale)


def gather_head_major(
    k_cache: torch.Tensor,  # [N, bs, Hkv, D]
    v_cache: torch.Tensor,
    scales: Scales | None,
    block_tables: torch.Tensor,  # [B, W]
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:  # [B, Hkv, S, D] each, S = W * bs (transposed views)
    ks, vs = scales if scales is not None else (None, None)
    kc = gather(k_cache, ks, block_tables, dtype).transpose(1, 2)
    vc = gather(v_cache, vs, block_tables, dtype).transpose(1, 2)
    return kc, vc


def gemms_over_context(
    qh: torch.Tensor,  # [B, Hq, Q, D]
    kc: torch.Tensor,  # [B, Hkv, S, D] (gather_head_major)
    vc: torch.Tensor,
    visible: torch.Tensor,  # [B, 1, Q, S] bool
    scale: float,
) -> torch.Tensor:  # [B, Q, Hq, D] contiguous
    """A kv head's G x Q queries as the rows of two batched GEMMs over its contiguous context
    (the gather, dequantization and transpose are one pass Inductor fuses). torch's SDPA over the
    same context (its CPU flash kernel, blocked for many queries) cost more in the default model's
    saved steps (bench.kernels.step_rows, two ABAB runs, AMD EPYC, 2026-12-03): 8 decode rows at 256
    / 1,024 cached tokens 18.2-18.9 / 29.7-50.5 ms against 13.3-15.3 / 22.8-38.2, a 2-query verify
    row 8.1-8.6 / 9.8-15.1 against 5.2-5.5 / 7.6-10.3; one decode row about the same. Scores are
    rounded to the cache dtype, as eager's (_attend_matmul) are; the softmax runs in float32. They
    are materialised: [B, Hkv, G * Q, S] float32, 75 MB a layer for a 1,024-token prefill over
    2,048 cached tokens (graphs.short_prefill's most)."""
    b, hq, nq, d = qh.shape
    hkv = kc.shape[1]
    kc, vc = kc.contiguous(), vc.contiguous()  # [B, Hkv, S, D]
    g, s = hq // hkv, kc.shape[2]
    # a copy, always: .contiguous() or a reshape of the verify step's transposed view would test
    # its layout, and export would guard on the queries (Q == 1 is contiguous) and fail
    qg = qh.clone(memory_format=torch.contiguous_format).view(b, hkv, g * nq, d)  # [B, Hkv, G * Q, D]
    scores = torch.matmul(qg, kc.transpose(2, 3)).float() * scale  # [B, Hkv, G * Q, S]
    scores = scores.view(b, hkv, g, nq, s).masked_fill(~visible[:, :, None], float("-inf"))
    p = torch.softmax(scores, dim=-1).to(qh.dtype).view(b, hkv, g * nq, s)
    o = torch.matmul(p, vc).view(b, hkv, g, nq, d).permute(0, 3, 1, 2, 4)  # [B, Q, Hkv, G, D]
    # a copy, always, from this layout: any other way to [B, Q, Hq, D] made export guard on Q
    return o.clone(memory_format=torch.contiguous_format).view(b, nq, hq, d)


def sdpa_over_context(
    qh: torch.Tensor,  # [B, Hq, Q, D]
    kc: torch.Tensor,  # [B, Hkv, S, D] (gather_head_major)
    vc: torch.Tensor,
    visible: torch.Tensor,  # [B, 1, Q, S] bool
    scale: float,
) -> torch.Tensor:  # [B, Q, Hq, D] contiguous
    """torch's fused attention (CUDA) over the gathered contexts."""
    o = torch.nn.functional.scaled_dot_product_attention(
        qh, kc, vc, attn_mask=visible, scale=scale, enable_gqa=True
    )  # [B, Hq, Q, D]
    return o.transpose(1, 2).clone(memory_format=torch.contiguous_format)
