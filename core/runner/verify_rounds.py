"""A verify step's LM head and sampling in rounds (CPU): the logits of a position after its
sequence's first refused draft token are never computed, since that position is never emitted.

On CPU the head is a large share of a verify step. torch's int8 kernel, the head of sampled rows,
is compute-bound past one row: 1 / 4 / 9 rows cost 0.95 / 1.6 / 4.2 ms on 2 threads
(bench/RESULTS.md), and a k = 4 draft keeps 1.5 tokens on average on input-grounded prompts. So
there each verify run's positions go `ROUND` at a time: round r computes and samples positions
[r * ROUND, (r + 1) * ROUND) of the runs whose every position so far kept its draft token. Rows
that sample once per sequence (a prompt's last chunk, a decode) are in the first round. A head
whose cost is its pass over the weights (the candidate pass of plain greedy rows, a float head)
takes every row in one round (`round_rows`): in a step as the engine runs it (the head's 28 MB
read from memory) the default model's candidate pass costs ~1.8 ms a call and a few hundredths of
a ms a row, so a second round cost more than the rows it saved (bench/RESULTS.md, 2026-12-05).

The emitted tokens are those of sampling every row at once: a row's logits are bitwise the same
in any grouping of rows (the head's rows are independent; tests/core/quant), and each row is
sampled as a plain step of its own (core/spec/views.py: its own penalties, grammar mask and
seeded draw). Unseeded random rows draw from the shared generator in another order, which does
not change their distribution. A row that is not computed gets the token -1 and no logprobs:
landing (core/engine/runs.py) stops at the first refused position, before it.

Not on CUDA: there the head of every row is one launch, and a round would make the host wait for
the device in the middle of a launch (engine.overlap).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from rillet.core.quant.int4 import ROW_BLOCK
from rillet.core.runner.base import SampleResult
from rillet.core.runner.inflight.sample_output import DeviceSample
from rillet.core.runner.sampler import Sampler
from rillet.core.sequence import Seq, TokenLogprob
from rillet.core.spec.views import runs_of
from rillet.core.structured.masks import PendingMask

ROUND = ROW_BLOCK  # positions per run and round: the int8 head's block of rows
NOT_COMPUTED = -1  # the token of a row past its run's first refusal
ALL = 1 << 30  # positions per round: every position of every run in the first


@dataclass(slots=True)
class Ready:
    """A step's sampled tokens that are on the host already (the `wait()` of an InflightStep)."""

    result: SampleResult

    def wait(self) -> SampleResult:
        return self.result


def sample_in_rounds(
    logits_of: Callable[[torch.Tensor], torch.Tensor],  # hidden rows [R, H] -> float32 logits [R, V]
    sampler: Sampler,
    hidden: torch.Tensor,  # [S, H]: the hidden state of every sample row of the step
    views: list[Seq],  # [S]: each row's sequence as the sampler sees it (position_views)
    owners: list[Seq],  # [S]: each row's sequence (StepInputs.sample_seqs): its draft_ids
    offsets: list[int],  # [S]: each row's position in its verify run
    mask: PendingMask | None,  # grammar bitmasks of the step's rows (core/spec/grammar.py)
    per_round: int,  # positions of each run per round (round_rows)
    greedy: Callable[[torch.Tensor], torch.Tensor] | None = None,  # plain greedy rows' tokens [R]
) -> tuple[SampleResult, torch.Tensor]:
    """-> the step's SampleResult over all S rows (NOT_COMPUTED past a refusal) and its tokens [S]."""
    total = len(views)
    tokens = [NOT_COMPUTED] * total
    logprobs: list[TokenLogprob | None] = [None] * total
    active = runs_of(offsets)
    first = 0  # the round's first position in each run
    while active:
        rows = [s + j for s, n in active for j in range(first, min(first + per_round, n))]
        picked = hidden if len(rows) == total else hidden.index_select(0, _index(rows, hidden.device))
        part_mask = None if mask is None else mask.take(rows)
        if greedy is not None and part_mask is None:  # every row plain greedy (DecoderModel.greedy_tokens)
            sample = DeviceSample(greedy(picked))
        else:
            sample = sampler.sample_device(logits_of(picked), [views[i] for i in rows], part_mask)
        got = sample.start_copy().wait()
        for i, token, lp in zip(rows, got.token_ids, got.logprobs, strict=True):
            tokens[i], logprobs[i] = token, lp
        last = first + per_round
        active = [
            (s, n) for s, n in active if n > last and _kept(owners[s].draft_ids, tokens, s, first, last)
        ]
        first = last
    return SampleResult(tokens, logprobs), torch.tensor(tokens, dtype=torch.int64, device=hidden.device)


def round_rows(per_row_block: bool) -> int:
    """Positions of a run per round: `ROUND` where the head costs a pass per block of rows
    (DecoderModel.head_per_row_block), else all of them in one round."""
    return ROUND if per_row_block else ALL


def _kept(draft: list[int], tokens: list[int], start: int, first: int, last: int) -> bool:
    """Whether positions [first, last) of the run at row `start` all sampled their draft token."""
    return all(tokens[start + j] == draft[j] for j in range(first, last))


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=device)
