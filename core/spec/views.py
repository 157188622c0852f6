"""Each verified position sampled exactly as it would be without speculation.

A verify row of sequence s with draft d_0..d_{k-1} gives logits at k + 1 positions: position j
predicts the token after s's tokens + d_0..d_{j-1}. Sampling position j as a plain step would
sample that token (the same penalties over the same history, min_tokens counted at the same
output length, the grammar state after d_0..d_{j-1} (grammar.py), the same seeded draw, which
the sampler keys by the output position: sampler.py) gives y_j; the step keeps d_j while
y_j == d_j and ends with the first y_j that differs (or y_k when all agree).

That is standard rejection sampling for a point proposal: d_j is kept with probability p_j(d_j),
and after a refusal the token is y_j ~ p_j conditioned on y_j != d_j, the residual
(p_j - q_j)+ renormalised with q_j = one-hot(d_j). So every emitted token is distributed exactly as
without speculation, greedy outputs are the same token for token, and a seeded request draws the
same tokens with speculation on or off.
"""

from __future__ import annotations

from rillet.core.sequence import Seq


def position_views(rows: list[Seq], offsets: list[int]) -> list[Seq]:
    """rows[i] = the sequence of sample row i, offsets[i] = its position j in the sequence's
    verify run -> per row, the sequence as the sampler must see it there: its outputs followed by
    d_0..d_{j-1}. A row at j = 0 is the sequence itself. Views of rows without penalties only
    count the drafts (as pending tokens), since their sampling reads no output ids."""
    views: list[Seq] = []
    for seq, j in zip(rows, offsets, strict=True):
        if j == 0:
            views.append(seq)
            continue
        p = seq.params
        view = Seq(seq.seq_id, seq.request_id, seq.prompt_ids, p, arrival=seq.arrival, index=seq.index)
        if p.has_penalties:
            view.output_ids = seq.output_ids + seq.draft_ids[:j]
        else:
            view.output_ids, view.num_pending = seq.output_ids, j  # shared, never written
        view.grammar = seq.grammar
        views.append(view)
    return views


def accepted_run(draft: list[int], sampled: list[int]) -> int:
    """How many draft tokens the step keeps: the longest prefix that agrees with the tokens
    sampled at the same positions (`sampled` has one more entry than `draft`)."""
    a = 0
    for d, y in zip(draft, sampled, strict=False):
        if d != y:
            break
        a += 1
    return a


def runs_of(offsets: list[int]) -> list[tuple[int, int]]:
    """Sample-row offsets (StepInputs.sample_offsets) -> (first row, length) per verify run; a
    row sampled once per sequence is a run of 1. A run's rows are consecutive, offsets 0..k."""
    runs: list[tuple[int, int]] = []
    for i, j in enumerate(offsets):
        if j == 0:
            runs.append((i, 1))
        else:
            start, n = runs[-1]
            assert j == n, "verify rows out of order"
            runs[-1] = (start, n + 1)
    return runs
