"""Graph-safe paged attention for speculative verify steps, in plain torch.

Each of the B rows feeds Q query tokens: its last token and its draft tokens, padded to Q (a fixed
bucket, so a compiled or captured step never sees a new shape). Query i of row b sits at position
p(b, i) = seq_lens[b] - query_lens[b] + i and attends to the row's cached keys at positions
<= p(b, i) that are < seq_lens[b]: causal among the new tokens, whose K/V are written first.
Padding queries (i >= query_lens[b]) write to slot 0 (the dummy block) and see the row's whole
context; their outputs are thrown away. Compiled, the attention is paged_decode.py's
attend_over_blocks over the gathered contexts (reductions Inductor fuses for soft-capped scores); eager,
batched matmuls. Like paged_decode.py: no host data, no shape taken from
tensor values, the same code eager, compiled (fullgraph) and captured; a sliding `window` and a
`softcap` are Python constants of the traced code, as there (each query sees its last `window`
positions; scores capped as cap * tanh(s / cap) before the mask). An int8 pool's `scales` are
written and read beside its codes, as there.
"""

from __future__ import annotations

import torch
from rillet.core.attention import cpu_kernel
from rillet.core.attention.base import VerifyMetadata
from rillet.core.attention.kv_cache import Scales, gather, gather_blocks, rotate, rotated
from rillet.core.attention.paged_decode import attend_over_blocks, write_decode_kv


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
    scales: Scales | None = None,
    kernel: bool = False,
) -> torch.Tensor:  # [B * Q, Hq, D]
    """`kernel`: through rillet's CPU kernel (cpu_kernel.py), as paged_decode.py's."""
    write_decode_kv(k, v, k_cache, v_cache, meta.slot_mapping.reshape(-1), scales)
    if kernel and scales is None and softcap is None:
        qr = q.view(*meta.slot_mapping.shape, *q.shape[1:])  # [B, Q, Hq, D]
        return cpu_kernel.attend(qr, k_cache, v_cache, meta, scale, window).flatten(0, 1)
    if rotated(scales):  # an int8 pool holds K/V rotated: attend in its space (kv_cache.py)
        q = rotate(q)
    if torch.compiler.is_compiling():  # capped scores take the reductions (SDPA has no softcap)
        attend = _attend_fused if softcap is not None else _attend_gathered
    else:
        attend = _attend_matmul
    o = attend(q, k_cache, v_cache, meta, scale, window, softcap, scales)
    return rotate(o) if rotated(scales) else o


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
    scales: Scales | None = None,
) -> torch.Tensor:
    """As reductions for Inductor, which fuses the block gather into them (paged_decode.py's
    reasoning): the width and block axes are never merged, so no index expression ties W to B."""
    b, w = meta.block_tables.shape
    nq = meta.slot_mapping.shape[1]
    bs, hkv, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    g = q.shape[1] // hkv
    ks, vs = scales if scales is not None else (None, None)
    qg = q.view(b, nq, hkv, g, d).permute(0, 2, 1, 3, 4).float()[:, :, :, :, None, None, :]
    # [B, Hkv, 1, 1, W, bs, D] float32 views of the gathered blocks
    kt = gather_blocks(k_cache, ks, meta.block_tables).permute(0, 3, 1, 2, 4)[:, :, None, None]
    vt = gather_blocks(v_cache, vs, meta.block_tables).permute(0, 3, 1, 2, 4)[:, :, None, None]
    scores = _cap((qg * kt).sum(-1) * scale, softcap)  # [B, Hkv, Q, G, W, bs]
    visible = _visible(meta, w, bs, q.device, window)[:, None, :, None]  # [B, 1, Q, 1, W, bs]
    scores = scores.masked_fill(~visible, float("-inf"))
    e = torch.exp(scores - scores.amax(dim=(4, 5), keepdim=True))
    p = e / e.sum(dim=(4, 5), keepdim=True)
    o = (p[..., None] * vt).sum(dim=(4, 5))  # [B, Hkv, Q, G, D]
    return o.permute(0, 2, 1, 3, 4).to(q.dtype).reshape(b * nq, q.shape[1], d)


def _attend_matmul(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: VerifyMetadata,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    scales: Scales | None = None,
) -> torch.Tensor:
    """Eager (and CUDA-graph capture): batched matmuls over the gathered contexts."""
    b, w = meta.block_tables.shape
    nq = meta.slot_mapping.shape[1]
    bs, hkv, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    ks, vs = scales if scales is not None else (None, None)
    kc = gather(k_cache, ks, meta.block_tables, q.dtype)  # [B, S, Hkv, D]
    vc = gather(v_cache, vs, meta.block_tables, q.dtype)
    qg = q.view(b, nq, hkv, q.shape[1] // hkv, d)  # [B, Q, Hkv, G, D]
    scores = torch.einsum("bqhgd,bshd->bhqgs", qg, kc).float() * scale  # [B, Hkv, Q, G, S]
    scores = _cap(scores, softcap)
    visible = _visible(meta, w, bs, q.device, window).view(b, 1, nq, 1, w * bs)
    scores = scores.masked_fill(~visible, float("-inf"))
    p = torch.softmax(scores, dim=-1).to(q.dtype)
    o = torch.einsum("bhqgs,bshd->bqhgd", p, vc)  # [B, Q, Hkv, G, D]
    return o.reshape(b * nq, q.shape[1], d)


def _attend_gathered(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: VerifyMetadata,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    scales: Scales | None = None,
) -> torch.Tensor:
    """Compiled: the gathered contexts through paged_decode.py's attend_over_blocks (GEMMs on CPU,
    SDPA on CUDA), the causal/window visibility as a boolean mask. With several queries a row the
    reductions above turn compute-bound and cost ~3 us per query x context token on the default
    model (a 9-query step over 1,024 tokens 44 ms); SDPA took 26 there (bench/RESULTS.md).
    Every query sees at least one key (a padding query its row's whole context, a padding row slot
    0), so no row of the mask is empty."""
    b, w = meta.block_tables.shape
    nq = meta.slot_mapping.shape[1]
    bs, d = k_cache.shape[1], k_cache.shape[3]
    qh = q.view(b, nq, q.shape[1], d).transpose(1, 2)  # [B, Hq, Q, D]
    visible = _visible(meta, w, bs, q.device, window).view(b, 1, nq, w * bs)
    o = attend_over_blocks(qh, k_cache, v_cache, scales, meta.block_tables, visible, scale)  # [B, Q, Hq, D]
    return o.view(b * nq, q.shape[1], d)
