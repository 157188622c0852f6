"""Attention whose result for a query row depends only on that row's query and its keys: not on
the batch, the other rows of its gemm, where a prefill chunk or a prefix-cache hit split its
context, or whether it runs as a prefill row or a decode row (deterministic mode, invariant.py).

Every row, prefill or decode, is reduced the same way over keys in fixed 64-key chunks at absolute
positions (chunk c holds keys 64c .. 64c + 63 of the sequence):
  scores  one gemm per chunk, [rows, D] x [D, 64]: N = 64 and K = D whatever the context;
  softmax the exact maximum over the row's keys, then exp; keys outside the row's range [lo, hi)
          are -inf, so exp gives exact zeros;
  P.V     one gemm per chunk, [rows, 64] x [64, Dv] (K = 64), V with a column of ones appended so
          that the same gemm sums the softmax denominator;
  chunks  added as a pairwise tree over chunk indices: a chunk past a row's context adds exact
          zeros, so a row gets the same bits from 3 chunks as from 30.
The rows of every gemm are padded by core/determinism/rows.py's rule. Computed in float32 whatever
the cache's dtype (bf16 bmm kernels were not measured); an int8 pool is dequantized as it is
gathered (attention/kv_cache.py: per-token scales, so a token's values never depend on its batch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from rillet.core.attention.kv_cache import Scales, gather
from rillet.core.determinism.rows import RowPadding

CHUNK = 64  # keys per gemm; a row's chunk boundaries are absolute positions
QUERY_TILE = 64  # prefill tokens per call: a tile reads only the chunks up to its last token


def _v_width(d: int) -> int:  # V | 1 | zeros: a multiple of 16 columns (MKL's N rule)
    return -(-(d + 1) // 16) * 16


def padded_len(s: int) -> int:
    return -(-s // CHUNK) * CHUNK


def attend(
    q: torch.Tensor,  # [X, M, D] float32 query rows (M already padded)
    k: torch.Tensor,  # [X, S, D] float32, S a multiple of CHUNK
    v1: torch.Tensor,  # [X, S, Dv] float32: V | 1 | 0
    lo: torch.Tensor | None,  # [X, M] int: first key each row reads (None: 0)
    hi: torch.Tensor,  # [X, M] int: one past its last key (> lo)
    scale: float,
    softcap: float | None,
) -> torch.Tensor:  # [X, M, D]
    x, d = q.shape[0], q.shape[2]
    n = k.shape[1] // CHUNK
    kc = k.view(x, n, CHUNK, d).transpose(2, 3)  # [X, n, D, CHUNK]
    s = torch.matmul(q[:, None], kc)  # [X, n, M, CHUNK]
    s.mul_(scale)
    if softcap is not None:  # Gemma 2: cap * tanh(s / cap), as the torch backend
        s = torch.tanh(s.div_(softcap)).mul_(softcap)
    pos = torch.arange(n * CHUNK, device=q.device).view(1, n, 1, CHUNK)
    outside = pos >= hi[:, None, :, None]
    if lo is not None:
        outside |= pos < lo[:, None, :, None]
    s.masked_fill_(outside, float("-inf"))
    s.sub_(s.amax(dim=(1, 3), keepdim=True)).exp_()
    part = torch.matmul(s, v1.view(x, n, CHUNK, -1))  # [X, n, M, Dv]
    while part.shape[1] > 1:  # pairwise over chunk indices; an odd count gets a zero chunk
        if part.shape[1] % 2:
            part = F.pad(part, (0, 0, 0, 0, 0, 1))
        part = part[:, 0::2] + part[:, 1::2]
    acc = part[:, 0]  # [X, M, Dv]
    return acc[..., :d] / acc[..., d : d + 1]


def gather_kv(
    k_cache: torch.Tensor,  # [N, bs, Hkv, D]
    v_cache: torch.Tensor,
    table: torch.Tensor,  # [X, W] block ids
    s: int,  # keys to keep per row (<= W * bs), padded to whole chunks with zeros
    scales: Scales | None = None,  # int8 pools
) -> tuple[torch.Tensor, torch.Tensor]:  # k [X, Hkv, S', D], v1 [X, Hkv, S', Dv] float32
    x = table.shape[0]
    hkv, d = k_cache.shape[2:]
    sp = padded_len(s)
    ks, vs = scales if scales is not None else (None, None)
    kg = gather(k_cache, ks, table, torch.float32)[:, :s].transpose(1, 2)  # [X, Hkv, s, D]
    vg = gather(v_cache, vs, table, torch.float32)[:, :s].transpose(1, 2)
    k = torch.empty(x, hkv, sp, d, dtype=torch.float32, device=k_cache.device)
    k[:, :, :s] = kg
    k[:, :, s:] = 0.0
    v1 = torch.empty(x, hkv, sp, _v_width(d), dtype=torch.float32, device=v_cache.device)
    v1[:, :, :s, :d] = vg
    v1[:, :, s:, :d] = 0.0
    v1[..., d] = 1.0
    v1[..., d + 1 :] = 0.0
    return k, v1


def prefill_attention(
    q: torch.Tensor,  # [L, Hq, D]: the last L tokens of one sequence
    k: torch.Tensor,  # [Hkv, S', D] its whole context (gather_kv), S' >= S padded
    v1: torch.Tensor,  # [Hkv, S', Dv]
    s: int,  # context length, this chunk included
    rows: RowPadding,
    scale: float,
    window: int | None,
    softcap: float | None,
) -> torch.Tensor:  # [L, Hq, D] float32
    n_tok, hq, d = q.shape
    hkv = k.shape[0]
    g = hq // hkv
    qg = q.float().reshape(n_tok, hkv, g, d).transpose(0, 1)  # [Hkv, L, G, D]
    out = torch.empty(hkv, n_tok, g, d, dtype=torch.float32, device=q.device)
    for t0 in range(0, n_tok, QUERY_TILE):
        t1 = min(n_tok, t0 + QUERY_TILE)
        tile = rows.pad(qg[:, t0:t1].reshape(hkv, (t1 - t0) * g, d))  # [Hkv, M, D]
        tok = (t0 + torch.arange(tile.shape[1], device=q.device) // g).clamp(max=t1 - 1)
        hi = (s - n_tok + 1 + tok).expand(hkv, -1)  # token t sits at s - L + t, sees keys <= it
        lo = None if window is None else (hi - window).clamp(min=0)
        n = padded_len(s - n_tok + t1)
        o = attend(tile, k[:, :n], v1[:, :n], lo, hi, scale, softcap)
        out[:, t0:t1] = o[:, : (t1 - t0) * g].view(hkv, t1 - t0, g, d)
    return out.transpose(0, 1).reshape(n_tok, hq, d)


def decode_attention(
    q: torch.Tensor,  # [B, Hq, D]: one query token per row
    k_cache: torch.Tensor,  # [N, bs, Hkv, D]
    v_cache: torch.Tensor,
    table: torch.Tensor,  # [B, W], covering every row's context
    seq_lens: torch.Tensor,  # [B] context length after this step (a padding row: <= 1)
    rows: RowPadding,
    scale: float,
    window: int | None,
    softcap: float | None,
    scales: Scales | None = None,
) -> torch.Tensor:  # [B, Hq, D] float32
    b, hq, d = q.shape
    hkv = k_cache.shape[2]
    g = hq // hkv
    k, v1 = gather_kv(k_cache, v_cache, table, table.shape[1] * k_cache.shape[1], scales)
    sp = k.shape[2]
    qg = rows.pad(q.float().reshape(b * hkv, g, d))  # [B*Hkv, M, D]
    hi = seq_lens.clamp(min=1).long().repeat_interleave(hkv)[:, None].expand(-1, qg.shape[1])
    lo = None if window is None else (hi - window).clamp(min=0)
    o = attend(qg, k.view(b * hkv, sp, d), v1.view(b * hkv, sp, -1), lo, hi, scale, softcap)
    return o[:, :g].reshape(b, hq, d)
