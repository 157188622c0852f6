"""Graph-safe paged attention for decode steps, in plain torch.

One query token per row. Everything the step needs is a tensor (`DecodeMetadata`): no host
lists, no shapes taken from tensor values, no branch on the row count. So the same code runs
eager, compiled by torch.compile with `fullgraph=True` (the compiled CPU decode step) and captured
into a CUDA graph (the CUDA fallback when flashinfer is absent).

Shapes are fixed by the caller: B rows, a block table W blocks wide. A padding row points at the
dummy block 0 (slot 0, context length 1) and is masked by its length like any other row; columns
past a row's context are masked the same way, so W may be any width that covers the longest
context in the step (the full `max_blocks_per_seq` for a CUDA graph, trimmed on CPU).

Compiled, the attention is torch's SDPA over the gathered contexts, or (soft-capped scores, which
SDPA cannot cap) two reductions Inductor fuses the block gather into; eager, batched matmuls.
Per-layer options are Python constants of the traced code: a sliding `window` adds
`position >= seq_len - window` to the mask, `softcap` caps the scores (cap * tanh(s / cap)) before
it. Neither branches on a tensor's value. An int8 pool's `scales` are read beside the codes and
multiplied in where the values are read (attention/kv_cache.py), traced like the rest.
"""

from __future__ import annotations

import torch
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
) -> torch.Tensor:  # [B, Hq, D]
    """Writes this step's K/V, then each row attends over its first seq_lens[b] cached tokens
    (its last `window` of them for a sliding layer)."""
    write_decode_kv(k, v, k_cache, v_cache, meta.slot_mapping, scales)
    if rotated(scales):  # an int8 pool holds K/V rotated: attend in its space (kv_cache.py)
        q = rotate(q)
    if torch.compiler.is_compiling():
        attend = _attend_fused if softcap is not None else _attend_sdpa
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


def _attend_sdpa(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [N, bs, Hkv, D]
    v_cache: torch.Tensor,
    meta: DecodeMetadata,
    scale: float,
    window: int | None,
    softcap: float | None,
    scales: Scales | None = None,
) -> torch.Tensor:  # [B, Hq, D]
    """Compiled: the valid keys as a mask (a row always has one: seq_lens >= 1). Faster than the
    reductions above once contexts grow (the default model's step at 1,024 / 2,048 cached tokens
    21.4 / 34.9 -> 17.5 / 28.7 ms, bench/RESULTS.md), and the same kernel as the compiled verify step's
    (paged_verify.py), so a verify row and a decode step round alike."""
    b, w = meta.block_tables.shape
    d = k_cache.shape[3]
    s = w * k_cache.shape[1]
    valid = _valid(torch.arange(s, device=q.device)[None, :], meta.seq_lens[:, None], window)  # [B, S]
    qh = q.view(b, q.shape[1], 1, d)  # [B, Hq, 1, D]
    o = sdpa_over_blocks(qh, k_cache, v_cache, scales, meta.block_tables, valid[:, None, None, :], scale)
    return o.reshape(b, q.shape[1], d)


def sdpa_over_blocks(
    qh: torch.Tensor,  # [B, Hq, Q, D]
    k_cache: torch.Tensor,  # [N, bs, Hkv, D]
    v_cache: torch.Tensor,
    scales: Scales | None,
    block_tables: torch.Tensor,  # [B, W]
    visible: torch.Tensor,  # [B, 1, Q, W * bs] bool: no query without a visible key
    scale: float,
) -> torch.Tensor:  # [B, Hq, Q, D]
    """Each row's blocks gathered (dequantized) and attended by torch's fused attention (its CPU
    flash kernel), the query heads grouped over the KV heads: the compiled decode and verify steps."""
    ks, vs = scales if scales is not None else (None, None)
    kc = gather(k_cache, ks, block_tables, qh.dtype).transpose(1, 2)  # [B, Hkv, S, D]
    vc = gather(v_cache, vs, block_tables, qh.dtype).transpose(1, 2)
    return torch.nn.functional.scaled_dot_product_attention(
        qh, kc, vc, attn_mask=visible, scale=scale, enable_gqa=True
    )
