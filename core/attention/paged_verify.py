"""Graph-safe paged attention for speculative verify steps, in plain torch.

Each of the B rows feeds Q query tokens: its last token and its draft tokens, padded to Q (a fixed
bucket, so a compiled or captured step never sees a new shape). Query i of row b sits at position
p(b, i) = seq_lens[b] - query_lens[b] + i and attends to the row's cached keys at positions
<= p(b, i) that are < seq_lens[b]: causal among the new tokens, whose K/V are written first.
Padding queries (i >= query_lens[b]) write to slot 0 (the dummy block) and see the row's whole
context; their outputs are thrown away. Like paged_decode.py: no host data, no shape taken from
tensor values, the same code eager, compiled (fullgraph) and captured; a sliding `window` and a
`softcap` are Python constants of the traced code, as there (each query sees its last `window`
positions; scores capped as cap * tanh(s / cap) before the mask).
"""

from __future__ import annotations

import torch
from rillet.core.attention.base import VerifyMetadata


def paged_verify_attention(
    q: torch.Tensor,  # [B * Q, Hq, D]
    k: torch.Tensor,  # [B * Q, Hkv, D]
    v: torch.Tensor,  # [B * Q, Hkv, D]
    k_cache: torch.Tensor,  # [N, bs, Hkv, D]
    v_cache: torch.Tensor,
    meta: VerifyMetadata,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:  # [B * Q, Hq, D]
    slots = meta.slot_mapping.reshape(-1)
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k.to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v.to(v_cache.dtype)
    if torch.compiler.is_compiling():
        return _attend_fused(q, k_cache, v_cache, meta, scale, window, softcap)
    return _attend_matmul(q, k_cache, v_cache, meta, scale, window, softcap)


def _visible(meta: VerifyMetadata, w: int, bs: int, device: torch.device, window: int | None) -> torch.Tensor:
    """[B, Q, W, bs] bool: key position (w, s) visible to query i of row b."""
    nq = meta.slot_mapping.shape[1]
    qpos = (meta.seq_lens - meta.query_lens)[:, None] + torch.arange(nq, device=device)  # [B, Q]
    pos = torch.arange(w * bs, device=device).view(w, bs)[None, None]
    visible = (pos <= qpos[:, :, None, None]) & (pos < meta.seq_lens[:, None, None, None])
    return visible if window is None else visible & (pos > qpos[:, :, None, None] - window)


def _cap(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return scores if softcap is None else torch.tanh(scores / softcap) * softcap


def _attend_fused(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: VerifyMetadata,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """As reductions for Inductor, which fuses the block gather into them (paged_decode.py's
    reasoning): the width and block axes are never merged, so no index expression ties W to B."""
    b, w = meta.block_tables.shape
    nq = meta.slot_mapping.shape[1]
    bs, hkv, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    g = q.shape[1] // hkv
    table = meta.block_tables.reshape(-1)
    qg = q.view(b, nq, hkv, g, d).permute(0, 2, 1, 3, 4).float()[:, :, :, :, None, None, :]
    # [B, Hkv, 1, 1, W, bs, D] views of the gathered blocks
    kt = k_cache.index_select(0, table).view(b, w, bs, hkv, d).permute(0, 3, 1, 2, 4)[:, :, None, None]
    vt = v_cache.index_select(0, table).view(b, w, bs, hkv, d).permute(0, 3, 1, 2, 4)[:, :, None, None]
    scores = _cap((qg * kt.float()).sum(-1) * scale, softcap)  # [B, Hkv, Q, G, W, bs]
    visible = _visible(meta, w, bs, q.device, window)[:, None, :, None]  # [B, 1, Q, 1, W, bs]
    scores = scores.masked_fill(~visible, float("-inf"))
    e = torch.exp(scores - scores.amax(dim=(4, 5), keepdim=True))
    p = e / e.sum(dim=(4, 5), keepdim=True)
    o = (p[..., None] * vt.float()).sum(dim=(4, 5))  # [B, Hkv, Q, G, D]
    return o.permute(0, 2, 1, 3, 4).to(q.dtype).reshape(b * nq, q.shape[1], d)


def _attend_matmul(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: VerifyMetadata,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Eager (and CUDA-graph capture): batched matmuls over the gathered contexts."""
    b, w = meta.block_tables.shape
    nq = meta.slot_mapping.shape[1]
    bs, hkv, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    table = meta.block_tables.reshape(-1)
    kc = k_cache.index_select(0, table).view(b, w * bs, hkv, d)  # [B, S, Hkv, D]
    vc = v_cache.index_select(0, table).view(b, w * bs, hkv, d)
    qg = q.view(b, nq, hkv, q.shape[1] // hkv, d)  # [B, Q, Hkv, G, D]
    scores = torch.einsum("bqhgd,bshd->bhqgs", qg, kc.to(q.dtype)).float() * scale  # [B, Hkv, Q, G, S]
    scores = _cap(scores, softcap)
    visible = _visible(meta, w, bs, q.device, window).view(b, 1, nq, 1, w * bs)
    scores = scores.masked_fill(~visible, float("-inf"))
    p = torch.softmax(scores, dim=-1).to(q.dtype)
    o = torch.einsum("bhqgs,bshd->bqhgd", p, vc.to(q.dtype))  # [B, Q, Hkv, G, D]
    return o.reshape(b * nq, q.shape[1], d)
