"""scheduler.policy priority: the order of waiting and running sequences, and the running ones that
better waiting ones displace when every batch place is taken.

A sequence's key is (effective priority, arrival, seq id), lower first: the request's `priority`
(vLLM's convention: lower runs first, default 0) less one for every `scheduler.max_wait_s` since it
arrived (aging, against starvation: a request of priority p behind a steady stream of priority
q < p is passed only by requests up to about (p - q + 1) * max_wait_s younger than it, then runs
ahead of the rest). Aging counts from arrival for waiting and running sequences alike, so it
changes only old against young. Arrival breaks ties, so at equal priority it is first come, first
served, and a preempted sequence (which keeps its arrival) goes back ahead of later ones.

The waiting queue stays sorted: a sequence entering it is inserted at its place (O(log n) probes),
and the queue is sorted again only once some waiting sequence's age crosses a step of max_wait_s
(`_next_age`), the only moment keys change order. The running list (at most max_num_seqs) is
sorted at every step, so the scheduler's "last running sequence", which it preempts when blocks
run out, is the worst priority, then the latest arrival (as vLLM's priority policy).

Displacement: a waiting sequence whose effective priority is strictly better than the worst running
one's takes its batch place; that one is preempted as for blocks (KV freed, recomputed when it is
readmitted, its output continuing where it stopped). Equal priorities never displace (no churn).
Not displaced: embedding sequences (prompt-only, they leave within a few steps) and a sequence whose
last token is in flight (it leaves as soon as the host sees it).
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable

from rillet.core.sequence import Seq

Key = tuple[int, float, int]


class PriorityOrder:
    def __init__(self, max_wait_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        """`clock`: Seq.arrival's (tests step a fake one)."""
        self.max_wait_s = max_wait_s
        self.clock = clock
        self.now = clock()  # one clock reading per step: every key of a step agrees
        self._next_age = math.inf  # when a waiting sequence's effective priority next improves

    def key(self, seq: Seq) -> Key:
        return (self.effective(seq), seq.arrival, seq.seq_id)

    def effective(self, seq: Seq) -> int:
        """The priority it is scheduled with: its own, improved by one per max_wait_s of age."""
        wait = self.max_wait_s
        if wait is None:
            return seq.priority
        return seq.priority - int(max(0.0, self.now - seq.arrival) // wait)

    def insert(self, waiting: deque[Seq], seq: Seq) -> None:
        bisect.insort(waiting, seq, key=self.key)
        self._next_age = min(self._next_age, self._aged_at(seq))

    def tick(self, waiting: deque[Seq], running: list[Seq]) -> None:
        """At the top of a step: the clock read, the running list sorted, and the waiting queue
        sorted again if an age step has passed for any of it."""
        self.now = self.clock()
        if self.now >= self._next_age:
            ordered = sorted(waiting, key=self.key)
            waiting.clear()
            waiting.extend(ordered)
            self._next_age = min((self._aged_at(s) for s in waiting), default=math.inf)
        running.sort(key=self.key)

    def _aged_at(self, seq: Seq) -> float:
        wait = self.max_wait_s
        if wait is None:
            return math.inf
        steps = int(max(0.0, self.now - seq.arrival) // wait)
        return seq.arrival + (steps + 1) * wait

    def displaced(self, waiting: deque[Seq], running: list[Seq], places: int) -> list[Seq]:
        """The running sequences (worst first) whose places better waiting ones take; `running`
        sorted by `tick`, `places` the batch's (scheduler.max_num_seqs)."""
        free = places - len(running)
        victims: list[Seq] = []
        j = len(running) - 1
        for seq in waiting:
            if free > 0:  # a free place: it takes that one
                free -= 1
                continue
            if not _admissible(seq):
                break  # it cannot be admitted this step: preempting for it would gain nothing
            while j >= 0 and not _displaceable(running[j]):
                j -= 1
            if j < 0 or self.effective(seq) >= self.effective(running[j]):
                break  # the queue is sorted: no one behind it is better either
            victims.append(running[j])
            j -= 1
        return victims


def _admissible(seq: Seq) -> bool:
    """As the scheduler's admission: not with a token in flight, nor an n > 1 copy whose leader
    is still in prefill."""
    leader = seq.leader
    return not seq.num_pending and (leader is None or leader.is_finished or not leader.in_prefill)


def _displaceable(seq: Seq) -> bool:
    if seq.embed is not None:
        return False
    return not (seq.num_pending and len(seq.output_ids) + seq.num_pending >= seq.params.max_tokens)
