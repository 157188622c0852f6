"""How many of a proposal's tokens a request drafts: the policies behind one interface.

A verify step pays for every drafted token (a query row of the forward; on CPU ~10 % of a decode
step each, the int4 kernels being compute-bound past one row) and gains a token only for each
accepted one. Per request the speculator asks its policy for the most tokens it may draft
(`next_k`, before proposing), lets it cut the proposal (`keep`), and reports how the verify went
(`observe`). Two policies:

  - `AdaptiveK` (adaptive.py), for drafters that pay per token (a draft model): k is decided
    before proposing, from how the request's last drafts went.
  - `ByMatch` here, for a lookup (the n-gram drafter), which proposes up to `num_tokens` for free:
    per length n of the matched suffix, the request estimates q, the chance that a drafted token
    is accepted given that the ones before it were: q = (accepted + W q0) / (accepted + refused +
    W), counting each verify's refusal once, since nothing after it is seen, over a prior of W =
    PRIOR_WEIGHT pseudo-counts with mean q0 = `prior_q(n)` = 1 - PRIOR_MISS / n. A longer match
    predicts better before the request has seen any (measured on the default model's greedy
    answers, bench/RESULTS.md 2026-12-03: q per n = 1 / 2 / 3 / 4 was 0.55-0.59 / 0.73-0.74 /
    0.79-0.86 / 0.80-0.95 on grounded prompts, 0.18 / 0.47 / 0.67 / 0.78 in open chat), so a
    4-token match's first draft is long and a 1-token match's short, where the flat Beta(1, 1)
    prior of before (q0 = 1/2 for every n) drafted 3 tokens for both. The j-th token is kept
    while q^j, the chance that it is reached and accepted, is at least `row_cost` (a verified
    row's cost as a fraction of a decode step): longer matches earn longer drafts, a match
    length whose drafts are refused stops drafting. A match length that
    no longer drafts forgets SKIP_DECAY of its counts each time it matches, so a request tries
    it again after a while (its text may have turned into a quote).

    With B sequences running the bar is B x `row_cost`: the step already yields B tokens, so a
    drafted row must earn what a row of each of them does. Measured on the Zen 5 EPYC with
    rillet's int4 kernel (bench/RESULTS.md, 2026-12-04, engine-level, 2 threads), n-gram drafts
    against none at batch 2: open chat 0.91 with the flat bar of 0.2, grounded prompts 1.37; the
    batch-2 bars of 0.4-0.5 kept grounded's gain and open chat at 0.97-1.03 on the same CPU the
    day before.
"""

from __future__ import annotations

from typing import Protocol

from rillet.core.spec.drafter import Draft

SKIP_DECAY = 0.9  # share of a silent match length's counts kept each time it matches
PRIOR_WEIGHT = 2.0  # pseudo-counts of the prior (as many as Beta(1, 1)'s)
PRIOR_MISS = 0.6  # prior_q(n) = 1 - PRIOR_MISS / n: 0.4, 0.7, 0.8, 0.85 for n = 1..4
# speculative.row_cost by device when not set. CPU, int4 weights through AMX tiles, measured
# (bench/RESULTS.md, 2026-12-03): with the small-batch decode step (graphs.small_batch) a batch-1
# decode step costs 5.3 ms and a verify step as 2 / 3 / 4 decode rows 6.0 / 7.4 / 8.2 ms (+0.14-0.19
# a row); at 0.1 n-gram drafts cost open chat 7 % (0.933 of spec off), at 0.2 1 % (0.99).
CPU_ROW_COST = 0.2
# CPU, int4 weights without the tiles (AVX512-BF16 or torch's kernel: a row's products cost per
# row): on a Zen 4 EPYC after the LM head's int4 candidate pass made a plain token ~5 ms, a verify
# row cost ~0.15 of it and the verify step's head ~0.2 more; n-gram ÷ off at 0.2 / 0.3 / 0.4 / 0.5:
# open chat 0.96 / 1.03 / 1.09 / 1.07, grounded 1.31 / 1.29 / 1.38 / 1.33, grounded-more 1.48 /
# 1.45 / 1.55 / 1.49 (bench/RESULTS.md, 2026-12-05)
CPU_ROW_COST_NO_TILES = 0.4
# CUDA: not measured; a decode step there is memory-bound, so extra query rows cost little
CUDA_ROW_COST = 0.02


def resolve_row_cost(configured: float | None, device_type: str, rows_cheap: bool = True) -> float:
    """speculative.row_cost, or the device's default; `rows_cheap`: on CPU, the int4 projections
    take a verify step's rows through AMX tiles (or the model has no int4 weights)."""
    if configured is not None:
        return configured
    if device_type == "cuda":
        return CUDA_ROW_COST
    return CPU_ROW_COST if rows_cheap else CPU_ROW_COST_NO_TILES


def prior_q(match: int) -> float:
    """The prior mean of q for drafts after a matched suffix of `match` tokens."""
    return 1.0 - PRIOR_MISS / max(match, 1)


class DraftLength(Protocol):
    def next_k(self) -> int:
        """The most tokens to draft this step (0: not speculating this step)."""
        ...

    def keep(self, draft: Draft, batch: int = 1) -> int:
        """How many of the proposal's tokens to draft, `batch` sequences running this step."""
        ...

    def observe(self, drafted: int, accepted: int) -> None:
        """The last kept draft of `drafted` tokens was verified: its first `accepted` were kept."""
        ...


class ByMatch:
    __slots__ = ("_match", "k_max", "row_cost", "stats")

    def __init__(self, k_max: int, row_cost: float) -> None:
        self.k_max = k_max
        self.row_cost = row_cost
        self.stats: dict[int, tuple[float, float]] = {}  # match length -> (accepted, refused)
        self._match = 0  # the match length of the last kept draft

    def next_k(self) -> int:
        return self.k_max

    def keep(self, draft: Draft, batch: int = 1) -> int:
        accepted, refused = self.stats.get(draft.match, (0.0, 0.0))
        q = (accepted + PRIOR_WEIGHT * prior_q(draft.match)) / (accepted + refused + PRIOR_WEIGHT)
        cost = self.row_cost * batch  # a drafted row must earn what a row of each running sequence does
        k, reach = 0, q
        while k < len(draft.tokens) and reach >= cost:
            k += 1
            reach *= q
        if k == 0 and draft.tokens:
            self.stats[draft.match] = (accepted * SKIP_DECAY, refused * SKIP_DECAY)
        self._match = draft.match
        return k

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        a, r = self.stats.get(self._match, (0.0, 0.0))
        self.stats[self._match] = (a + accepted, r + (accepted < drafted))
