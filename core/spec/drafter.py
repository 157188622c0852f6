"""What a drafter is: given sequences and how many tokens each may draft, propose them.

The engine calls `propose` once per step, before scheduling, for the decoding sequences that
speculate this step (none of them has a token in flight: a step with drafts is landed before the
next one is scheduled). A draft is a guess: the step's forward verifies it, so a drafter may
propose fewer tokens than asked, or none, and never has to be right.

Drafts are point proposals (one token per position, as the n-gram lookup and a greedy draft
model make), which the engine accepts by sampling each position as without speculation and
keeping the drafts while they agree (core/spec/views.py): for a point proposal that is exactly
standard rejection sampling. A drafter that samples its tokens from a distribution q uses
rejection.py's general rule instead.

A lookup (the n-gram drafter) costs nothing per token it proposes: it is `cheap`, asked for the
most tokens a step may take, and the speculator keeps as many as pay by what the lookup matched on
(`Draft.match`, draft_length.py). A drafter that runs a model pays a draft step per token: it is
asked for the k its request's adaptive length allows (adaptive.py) and proposes that many.

Room for EAGLE / MTP heads: a drafter that sets `wants_hidden` is meant to receive the target's
final hidden state of each sequence's last accepted position with `propose` (the runner has them
after a verify step). No drafter here asks for them yet, so the runner does not pass them.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from rillet.core.sequence import Seq


class Draft(NamedTuple):
    tokens: list[int]
    # what the proposal rests on, for the draft length (draft_length.py): the n-gram lookup's
    # matched suffix length; 0 for a model's draft
    match: int = 0


class Drafter(Protocol):
    name: str
    wants_hidden: bool  # EAGLE / MTP heads: `propose` gets the target's hidden states (not wired yet)
    cheap: bool  # proposing costs nothing per token (a lookup): the speculator trims by Draft.match

    def propose(self, seqs: list[Seq], ks: list[int], hidden: Any = None) -> list[Draft]:
        """Up to ks[i] draft tokens to follow seqs[i]'s tokens (prompt + output), per sequence."""
        ...

    def landed(self, seq: Seq) -> None:
        """The step that verified seq's draft has landed: its accepted tokens are appended (a
        drafter with state per position, e.g. a draft model's KV, rolls back what was refused)."""
        ...

    def release(self, seq: Seq) -> None:
        """The sequence finished, or was preempted: forget what is kept for it."""
        ...

    def close(self) -> None: ...
