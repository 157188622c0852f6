"""Per-request draft length for a drafter that pays per token (a draft model): draft more while
drafts are accepted, fewer when they are not, and stop speculating for a while when they mostly
are not.

A verify step costs more than a plain decode step (its extra query rows are real work, which on a
CPU is most of a step's cost beyond reading the weights once), so a request whose drafts are
refused is better off not drafting. Per request:
  - k: after a step that accepted every drafted token, k grows by one (up to num_tokens); after
    one that refused some, k becomes the accepted count + 1 (the run the model agreed with, and
    one more to find out whether it goes on);
  - a window of the last WINDOW drafted tokens: once it is full and less than MIN_ACCEPTANCE of
    them were accepted, the request pauses speculating for PAUSE_STEPS steps (plain decodes),
    twice as long after each pause that did not help, up to MAX_PAUSE_STEPS; then it drafts again
    from k = 1 with an empty window.
A step in which the drafter finds nothing (the n-gram lookup matched no suffix) costs nothing
and counts for nothing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rillet.core.spec.drafter import Draft

WINDOW = 24  # drafted tokens the acceptance rate is taken over
MIN_ACCEPTANCE = 0.25  # below this over a full window, the request pauses speculating
PAUSE_STEPS = 16
MAX_PAUSE_STEPS = 512


@dataclass
class AdaptiveK:
    k_max: int
    k: int = 0  # 0 = start at k_max
    pause: int = 0  # steps left without speculating
    next_pause: int = PAUSE_STEPS
    window: deque[tuple[int, int]] = field(default_factory=deque)  # (drafted, accepted) per step
    drafted_in_window: int = 0
    accepted_in_window: int = 0

    def __post_init__(self) -> None:
        self.k = self.k or self.k_max

    def next_k(self) -> int:
        """Tokens to draft this step (0 = not speculating this step)."""
        if self.pause:
            self.pause -= 1
            return 0
        return self.k

    def keep(self, draft: Draft, batch: int = 1) -> int:
        return len(draft.tokens)  # the drafter already drafted only k

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self.k = min(self.k_max, self.k + 1) if accepted == drafted else accepted + 1
        self.window.append((drafted, accepted))
        self.drafted_in_window += drafted
        self.accepted_in_window += accepted
        while self.drafted_in_window - self.window[0][0] >= WINDOW:
            d, a = self.window.popleft()
            self.drafted_in_window -= d
            self.accepted_in_window -= a
        if self.drafted_in_window < WINDOW:
            return
        if self.accepted_in_window < MIN_ACCEPTANCE * self.drafted_in_window:
            self.pause, self.k = self.next_pause, 1
            self.next_pause = min(MAX_PAUSE_STEPS, 2 * self.next_pause)
            self.window.clear()
            self.drafted_in_window = self.accepted_in_window = 0
        elif self.accepted_in_window >= 2 * MIN_ACCEPTANCE * self.drafted_in_window:
            self.next_pause = PAUSE_STEPS  # paying again: a later bad patch pauses briefly first
