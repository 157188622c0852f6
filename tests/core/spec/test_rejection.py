"""Rejection sampling keeps the target's distribution: on a toy target / draft pair whose next-token
distributions depend on the previous token, the first three generated tokens (several verify
steps, drafts drawn from a different distribution) are distributed as the target's chain.

The statistics are chi-square tests at a fixed seed: deterministic (no flake), with bounds far
above the value a correct sampler gives at any seed with meaningful probability (p < 1e-9 for 63
degrees of freedom) and far below what a wrong rule gives (a sampler that keeps every draft, or
draws the refused position from p instead of the residual, scores in the thousands here)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from rillet.core.runner.sampler import Sampler
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq
from rillet.core.spec.rejection import rejection_sample
from rillet.core.spec.views import accepted_run, position_views

V, K, LENGTH, TRIALS = 4, 2, 3, 30000
CHI2_BOUND = 150.0  # 63 degrees of freedom: mean 63, P(chi2 > 150) < 1e-9


def _chain(seed: int, sharp: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharp * torch.randn(V + 1, V, generator=g), dim=-1)  # [prev (V = start), next]


P, Q = _chain(1, 1.5), _chain(2, 1.5)


def _target_triples() -> torch.Tensor:  # [V, V, V] probability of each first three tokens
    start = P[V]
    return start[:, None, None] * P[:V, :, None] * P[None, :V, :].expand(V, V, V)


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic over the possible cells; an impossible outcome seen scores infinity."""
    possible = probs > 0
    if bool(counts[~possible].any()):
        return float("inf")
    expected = probs[possible] * counts.sum()
    return float(((counts[possible] - expected) ** 2 / expected).sum())


Step = Callable[[torch.Tensor, torch.Generator], tuple[torch.Tensor, torch.Tensor]]


def _generate(step: Step, seed: int) -> torch.Tensor:
    """Runs verify steps until every trial has LENGTH tokens; returns their triple counts [V, V, V]."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((TRIALS, LENGTH + K + 1), -1, dtype=torch.long)
    have = torch.zeros(TRIALS, dtype=torch.long)
    while bool((have < LENGTH).any()):
        prev = torch.where(have > 0, out.gather(1, (have - 1).clamp(min=0)[:, None])[:, 0], V)
        accepted, tokens = step(prev, g)
        for j in range(K + 1):
            write = (j <= accepted) & (have < LENGTH)
            idx = (have + j).clamp(max=out.shape[1] - 1)
            out[write, idx[write]] = tokens[write, j]
        have = torch.minimum(have + accepted + 1, torch.full_like(have, LENGTH + K + 1))
    first = out[:, :LENGTH]
    return (
        torch.bincount(first[:, 0] * V * V + first[:, 1] * V + first[:, 2], minlength=V**3)
        .view(V, V, V)
        .float()
    )


def _drafted(prev: torch.Tensor, g: torch.Generator, sampled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """K draft tokens per trial from Q's chain (sampled, or its argmax: a point proposal)."""
    drafts = []
    ctx = prev
    for _ in range(K):
        d = torch.multinomial(Q[ctx], 1, generator=g)[:, 0] if sampled else Q[ctx].argmax(-1)
        drafts.append(d)
        ctx = d
    draft = torch.stack(drafts, 1)  # [N, K]
    contexts = torch.cat([prev[:, None], draft], 1)  # [N, K + 1]: the context of each position
    return draft, contexts


def test_rejection_sampling_keeps_the_target_distribution() -> None:
    def step(prev: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        draft, ctx = _drafted(prev, g, sampled=True)
        v = rejection_sample(P[ctx], Q[ctx[:, :K]], draft, g)
        return v.accepted, v.tokens

    counts = _generate(step, seed=3)
    assert _chi2(counts, _target_triples()) < CHI2_BOUND


def test_point_proposals_keep_the_target_distribution() -> None:
    def step(prev: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        draft, ctx = _drafted(prev, g, sampled=False)
        v = rejection_sample(P[ctx], None, draft, g)
        return v.accepted, v.tokens

    counts = _generate(step, seed=4)
    assert _chi2(counts, _target_triples()) < CHI2_BOUND


def test_keeping_every_draft_is_caught() -> None:
    """The bound means something: a verifier that keeps every draft fails it by far."""

    def step(prev: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        draft, ctx = _drafted(prev, g, sampled=True)
        v = rejection_sample(P[ctx], Q[ctx[:, :K]], draft, g)
        return torch.full_like(v.accepted, K), v.tokens

    assert _chi2(_generate(step, seed=3), _target_triples()) > 10 * CHI2_BOUND


def test_the_engines_sample_and_compare_path_keeps_the_target_distribution() -> None:
    """What the engine runs for point proposals: each position sampled by the plain Sampler through
    its position view (temperature and top-k included), drafts kept while they agree."""
    sampler = Sampler(V, (), torch.device("cpu"), seed=5)
    params = SamplingParams(temperature=0.7, top_k=3, max_tokens=8)
    logits = P.log()  # the sampler's target: softmax(log P / 0.7) over the top 3 of each row
    tempered = torch.softmax(
        torch.where(logits >= logits.topk(3, -1).values[:, -1:], logits, -torch.inf) / 0.7, -1
    )
    seqs = [Seq(i, "r", [1], params) for i in range(TRIALS)]

    def step(prev: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        draft, ctx = _drafted(prev, g, sampled=False)
        rows, offsets = [], []
        for s, d in zip(seqs, draft.tolist(), strict=True):
            s.draft_ids = d
            rows += [s] * (K + 1)
            offsets += range(K + 1)
        views = position_views(rows, offsets)
        sampled = torch.tensor(sampler.sample(logits[ctx].reshape(-1, V), views).token_ids).view(-1, K + 1)
        accepted = torch.tensor(
            [accepted_run(d, y) for d, y in zip(draft.tolist(), sampled.tolist(), strict=True)]
        )
        return accepted, sampled

    counts = _generate(step, seed=6)
    start = tempered[V]
    want = start[:, None, None] * tempered[:V, :, None] * tempered[None, :V, :].expand(V, V, V)
    assert _chi2(counts, want) < CHI2_BOUND
