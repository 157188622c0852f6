"""Grammar masks of a verify step: position j of a constrained sequence's run is masked by its
grammar's state after the draft's first j tokens.

The drafts were checked against the grammar before the step (speculator.py cuts a draft at its
first refused token), so the matcher can consume them: per run, the mask of position 0 is filled,
the matcher consumes d_0, position 1 is filled, ..., and the matcher is rolled back by as many
tokens as it consumed. Once the grammar has ended (the matcher stopped) nothing more is consumed:
llguidance takes a drafted EOS there without counting it, and rolling it back would undo a kept
token (the next step's mask and the landing would then refuse valid tokens). The engine then
advances it with the tokens it keeps, as for any step.
Filled inline (no worker thread: each position needs the state left by the one before).
"""

from __future__ import annotations

import logging

import torch
from rillet.core.sequence import Seq
from rillet.core.spec.views import runs_of
from rillet.core.structured.masks import MaskFiller, PendingMask

log = logging.getLogger(__name__)


def verify_masks(filler: MaskFiller, rows: list[Seq], offsets: list[int]) -> PendingMask | None:
    """The bitmask rows of the constrained sample rows of a verify step (rows/offsets: see
    StepInputs.sample_seqs / sample_offsets)."""
    constrained = [i for i, s in enumerate(rows) if s.grammar is not None]
    if not constrained:
        return None
    bits = torch.empty(len(constrained), filler.words, dtype=torch.int32)
    j = 0  # bitmask row: a run's rows are all constrained or none (one sequence)
    for start, run in runs_of(offsets):
        if rows[start].grammar is not None:
            _fill_run(filler, rows[start], bits, j, run)
            j += run
    filler.stats.steps += 1
    filler.stats.rows += len(constrained)
    return PendingMask(constrained, bits, None, filler.stats)


def _fill_run(filler: MaskFiller, seq: Seq, bits: torch.Tensor, first: int, run: int) -> None:
    g = seq.grammar
    assert g is not None
    try:
        g.sync(seq.output_ids)
    except Exception:  # the engine fails the request on its own accept; here: EOS only
        log.debug("grammar of sequence %d is broken", seq.seq_id, exc_info=True)
    m = g.matcher
    consumed = 0
    for pos in range(run):
        if g.failed or m.is_stopped():
            filler.eos_only(bits[first + pos])
        else:
            filler.fill_now([(m, first + pos)], bits)
        # a stopped matcher takes EOS without counting it as a token to roll back (llguidance), so
        # nothing is consumed past the grammar's end: every later position is EOS-only anyway
        if pos + 1 < run and not g.failed and not m.is_stopped() and m.consume_token(seq.draft_ids[pos]):
            consumed += 1
    if consumed:
        m.rollback(consumed)
