"""Standard rejection sampling (Leviathan et al. 2023; Chen et al. 2023) for drafts drawn from a
distribution: the emitted tokens are distributed exactly as the target's, whatever the draft's.

Per row, with target distributions p_0..p_k (p_j: after the draft's first j tokens) and the draft's
q_0..q_{k-1} that d_0..d_{k-1} were drawn from:
  - d_j is kept with probability min(1, p_j(d_j) / q_j(d_j)), in order, until one is refused;
  - at the first refusal j the token is drawn from the residual (p_j - q_j)+ renormalised;
  - when all k are kept, a bonus token is drawn from p_k.
A point proposal (q_j = one-hot(d_j): the n-gram lookup, a greedy draft model) is the special case
that the engine runs through the plain sampler (views.py); this module serves a drafter that samples
its drafts, and states the rule the engine's path is an instance of (tests check both against the
target's distribution).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    accepted: torch.Tensor  # [B] long: draft tokens kept per row
    tokens: torch.Tensor  # [B, K + 1] long: row b emits tokens[b, : accepted[b] + 1]


def rejection_sample(
    p: torch.Tensor,  # [B, K + 1, V] float: target distributions (rows sum to 1)
    q: torch.Tensor | None,  # [B, K, V] float: the draft's distributions; None = point proposals
    draft: torch.Tensor,  # [B, K] long
    generator: torch.Generator | None = None,
) -> Verdict:
    b, k1, v = p.shape
    k = k1 - 1
    rows = torch.arange(b, device=p.device)[:, None]
    cols = torch.arange(k, device=p.device)[None, :]
    p_d = p[rows, cols, draft]  # [B, K]: p_j(d_j)
    q_d = torch.ones_like(p_d) if q is None else q[rows, cols, draft]
    u = torch.rand(b, k, generator=generator, device=p.device, dtype=p.dtype)
    keep = u * q_d < p_d  # u < p / q, without dividing by a zero q
    accepted = keep.long().cumprod(dim=1).sum(dim=1)  # [B]: leading kept drafts
    # the distribution the emitted token after the kept run is drawn from, per row
    at = accepted.clamp(max=k - 1) if k else accepted
    p_at = p[torch.arange(b, device=p.device), accepted]  # [B, V]: p_a (p_k when all kept)
    if k:
        q_at = (
            torch.nn.functional.one_hot(draft[torch.arange(b, device=p.device), at], v).to(p.dtype)
            if q is None
            else q[torch.arange(b, device=p.device), at]
        )
        residual = (p_at - q_at).clamp(min=0)
        # p == q at a refused position is impossible (it would have been kept): guard the 0 / 0
        mass = residual.sum(dim=-1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_at)
        refused = (accepted < k)[:, None]
        dist = torch.where(refused, residual, p_at)
    else:
        dist = p_at
    last = _draw(dist, generator)  # [B]
    tokens = torch.cat([draft, torch.zeros(b, 1, dtype=draft.dtype, device=draft.device)], dim=1)
    tokens[torch.arange(b, device=p.device), accepted] = last
    return Verdict(accepted, tokens)


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row, by the exponential race the sampler uses (argmax p / Exp(1))."""
    race = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / race).argmax(dim=-1)
