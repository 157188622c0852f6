"""Continuous batching: which sequences run this step, and how many new tokens each feeds.

Every step, within `max_num_batched_tokens` and `max_num_seqs`:
  1. running sequences first, in admission order: a decode feeds 1 token, a prefill feeds the next
     chunk of its prompt (chunked prefill); if the pool has no block for one, the most recently
     admitted running sequence is preempted (blocks freed, recomputed later from prompt + output
     so far, so its output continues exactly where it stopped);
  2. then waiting sequences are admitted in arrival order (preempted ones first), each taking its
     prefix-cache hits and a first chunk, while the budget, the batch cap and free blocks allow.
With overlapped steps (engine.overlap) a sequence may hold a pending token (sampled by the step in
flight, its id still on the device): it is scheduled as if that token were known (its decode input
comes from the device), and not at all once its pending token is its last by max_tokens.
Speculative decoding (core/spec/): a decoding sequence with a draft feeds 1 + len(draft) tokens (its
last token, then the draft, all verified by the step). A draft is cut to the token budget left
after one token for each running sequence behind it, and dropped rather than preempting anyone
for its blocks.
No tensors and no CUDA here: the scheduler is plain Python and unit-tested on CPU.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rillet.core.config import SchedulerConfig
from rillet.core.engine.block_manager import BlockManager
from rillet.core.sequence import FinishReason, Seq, SeqStatus


@dataclass
class ScheduledBatch:
    seqs: list[Seq] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)  # tokens fed per sequence this step
    preempted: list[Seq] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, blocks: BlockManager) -> None:
        self.cfg = cfg
        self.blocks = blocks
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []

    # ---- queue management --------------------------------------------------------------------
    def add(self, seq: Seq) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Seq, reason: FinishReason) -> None:
        """Removes a sequence wherever it is and frees its blocks."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        self.blocks.free(seq)

    # ---- the step ----------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.cfg.max_num_batched_tokens
        budget = self._schedule_running(batch, budget)
        if not batch.preempted:
            self._admit_waiting(batch, budget)
        return batch

    def _schedule_running(self, batch: ScheduledBatch, budget: int) -> int:
        # Runs once per running sequence per step: attributes are read directly, not through the
        # Seq properties, and a table that already covers the step skips the block manager.
        running, block_size = self.running, self.blocks.block_size
        seqs, num_new = batch.seqs, batch.num_new
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            pending, outputs = seq.num_pending, len(seq.output_ids)
            if pending and outputs + pending >= seq.params.max_tokens:
                i += 1  # its last token is in flight: it finishes when the host sees it
                continue
            n = len(seq.prompt_ids) + outputs + pending - seq.num_computed
            if seq.draft_ids:  # leaves a token of the budget to each running sequence after it
                n = _with_draft(seq, n, budget - (len(running) - i - 1))
            n = n if n < budget else budget
            end = seq.num_computed + n
            if end > len(seq.block_table) * block_size:
                while not self.blocks.grow(seq, end):
                    if seq.draft_ids:  # a draft never preempts anyone: it goes first
                        n -= len(seq.draft_ids)
                        seq.draft_ids = []
                        end = seq.num_computed + n
                        continue
                    victim = running[-1]
                    self._preempt(victim)
                    batch.preempted.append(victim)
                    if victim is seq:
                        return budget
            seqs.append(seq)
            num_new.append(n)
            budget -= n
            i += 1
        return budget

    def _admit_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            if seq.leader is not None and not seq.leader.is_finished and seq.leader.in_prefill:
                break  # n > 1 copies wait for the shared prompt to be cached, then reuse it
            if seq.num_pending:
                break  # preempted with a token in flight: recompute once the host has it
            n = self.blocks.admit(seq, budget)
            if n == 0:
                break
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new.append(n)
            budget -= n

    def _preempt(self, seq: Seq) -> None:
        self.running.remove(seq)
        seq.draft_ids = []
        self.blocks.free(seq)
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)


def _with_draft(seq: Seq, n: int, budget: int) -> int:
    """Tokens a sequence with a draft feeds: its n known ones, then as much of the draft as
    `budget` leaves room for (the draft is cut to that)."""
    room = budget - n
    if len(seq.draft_ids) > room:
        seq.draft_ids = seq.draft_ids[: max(0, room)]
    return n + len(seq.draft_ids)
