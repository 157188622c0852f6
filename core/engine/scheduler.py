"""Continuous batching: which sequences run this step, and how many new tokens each feeds.

Every step, within `max_num_batched_tokens` and `max_num_seqs`:
  1. running sequences first, in admission order: a decode feeds 1 token, a prefill feeds the next
     chunk of its prompt (chunked prefill); if the pool has no block for one, the most recently
     admitted running sequence is preempted (blocks freed, recomputed later from prompt + output
     so far, so its output continues exactly where it stopped);
  2. then waiting sequences are admitted in arrival order (preempted ones first), each taking its
     prefix-cache hits and a first chunk, while the budget, the batch cap and free blocks allow.
     An encoder's embedding sequence (bidirectional attention: no chunking) is admitted whole,
     when its whole prompt fits in what is left of the budget, and takes no KV blocks.
Embedding sequences are prompt-only (core/embedding.py): max_tokens 1, so once their last chunk is
in flight (a pending "token": the pooled vector) they are not scheduled again.
With overlapped steps (engine.overlap) a sequence may hold a pending token (sampled by the step in
flight, its id still on the device): it is scheduled as if that token were known (its decode input
comes from the device), and not at all once its pending token is its last by max_tokens.
Speculative decoding (core/spec/): a decoding sequence with a draft feeds 1 + len(draft) tokens (its
last token, then the draft, all verified by the step). A draft is cut to the token budget left
after one token for each running sequence behind it, and dropped rather than preempting anyone
for its blocks.
LoRA (core/lora/slots.py): a sequence of an adapter is admitted only once its adapter has a slot
in the stacked buffers (resident, free, or an idle one's to take); the slot is held while it runs.
Base-model sequences behind one that waits for a slot are admitted past it.
New placements travel with the batch (`lora_writes`) for the runner to copy before the step.
scheduler.policy priority (core/engine/scheduling/priority.py): "admission order" and "arrival order" above
read (priority, arrival); at the top of a step, better waiting sequences take the batch places of
worse running ones (those are preempted as for blocks), and the sequence preempted for blocks is
the worst priority, then the latest arrival.
No tensors and no CUDA here: the scheduler is plain Python and unit-tested on CPU.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from rillet.core.config import SchedulerConfig
from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.scheduling.encoder_budget import fit_images
from rillet.core.engine.scheduling.priority import PriorityOrder
from rillet.core.lora.slots import SlotTable, SlotWrite
from rillet.core.sequence import FinishReason, Seq, SeqStatus


@dataclass
class ScheduledBatch:
    seqs: list[Seq] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)  # tokens fed per sequence this step
    preempted: list[Seq] = field(default_factory=list)
    embed_tokens: int = 0  # of the tokens, those of embedding sequences
    embed_rows: int = 0  # of the sequences, embedding ones
    lora_writes: list[SlotWrite] = field(default_factory=list)  # adapters to copy into slots first

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, blocks: BlockManager) -> None:
        self.cfg = cfg
        self.blocks = blocks
        self.waiting: deque[Seq] = deque()  # generation sequences
        self.waiting_embed: deque[Seq] = deque()  # embedding sequences: admitted after generation ones
        self.running: list[Seq] = []
        # Embedding tokens the next step may take (set by the engine each step while chat and
        # embeddings share it: core/engine/scheduling/embed_share.py); None: no limit.
        self.embed_cap: int | None = None
        self.running_embeds = 0  # embedding sequences among `running`
        self.lora_slots: SlotTable | None = None  # set when the model serves LoRA adapters
        self._lora_writes: list[SlotWrite] = []  # placements not yet handed to a batch
        self.preemptions = 0  # sequences preempted since start (/metrics)
        # scheduler.policy priority: keeps `waiting` and `running` in priority order; None: fcfs
        self.order = PriorityOrder(cfg.max_wait_s) if cfg.policy == "priority" else None
        # A vision model's image tokens whose encoding may start in one step (None: no limit;
        # scheduling/encoder_budget.py), and what is left of it in the step being scheduled
        self.encoder_budget: int | None = None
        self._encoder_left = 0

    # ---- queue management --------------------------------------------------------------------
    def add(self, seq: Seq) -> None:
        seq.status = SeqStatus.WAITING
        if self.order is not None and seq.embed is None:
            self.order.insert(self.waiting, seq)
        else:
            self._queue(seq).append(seq)

    def _queue(self, seq: Seq) -> deque[Seq]:
        return self.waiting if seq.embed is None else self.waiting_embed

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.waiting_embed)

    @property
    def num_embeds(self) -> int:
        """Embedding sequences in the scheduler, waiting or running."""
        return self.running_embeds + len(self.waiting_embed)

    def finish(self, seq: Seq, reason: FinishReason) -> None:
        """Removes a sequence wherever it is and frees its blocks."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self.running_embeds -= seq.embed is not None
        elif seq.status is SeqStatus.WAITING:
            self._queue(seq).remove(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        self.blocks.free(seq)
        self._drop_slot(seq)

    def _drop_slot(self, seq: Seq) -> None:
        if seq.lora_slot and self.lora_slots is not None:
            self.lora_slots.release(seq.lora_slot)
        seq.lora_slot = 0

    # ---- the step ----------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.cfg.max_num_batched_tokens
        self._encoder_left = self.encoder_budget or 0
        room = self._embed_room()
        if self.order is not None:
            self._displace(self.order, batch)
        displaced = len(batch.preempted)
        budget, room = self._schedule_running(batch, budget, room)
        if len(batch.preempted) == displaced:  # no one was preempted for blocks
            budget = self._admit_waiting(self.waiting, batch, budget, None)
            if self.waiting_embed:
                self._admit_waiting(self.waiting_embed, batch, budget, room)
        if self._lora_writes and batch.seqs:  # kept for the next launched step otherwise
            batch.lora_writes, self._lora_writes = self._lora_writes, []
        return batch

    def _displace(self, order: PriorityOrder, batch: ScheduledBatch) -> None:
        order.tick(self.waiting, self.running)
        for victim in order.displaced(self.waiting, self.running, self.cfg.max_num_seqs):
            self._preempt(victim)
            batch.preempted.append(victim)

    @property
    def has_generation(self) -> bool:
        """Generation sequences are waiting or running."""
        return bool(self.waiting) or len(self.running) > self.running_embeds

    def _embed_room(self) -> int | None:
        """Embedding tokens this step may take (None: no limit)."""
        return self.embed_cap if self.num_embeds else None

    def _schedule_running(
        self, batch: ScheduledBatch, budget: int, room: int | None
    ) -> tuple[int, int | None]:
        # Runs once per running sequence per step: attributes are read directly, not through the
        # Seq properties, and a table that already covers the step skips the block manager.
        running, block_size = self.running, self.blocks.block_size
        seqs, num_new = batch.seqs, batch.num_new
        embeds = self.running_embeds
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
            if seq.mm is not None:  # a chunk never splits a bidirectional image (Gemma 3)
                n = seq.mm.chunk_tokens(seq.num_computed, n)
                if n == 0:
                    i += 1  # its image waits for a step with the budget for all of it
                    continue
            if seq.mm is not None and self.encoder_budget is not None:
                n = self._fit_images(seq, seq.num_computed, n)
                if n <= 0:
                    i += 1  # its next image waits for a step with encoder budget left
                    continue
            embed = embeds and seq.embed is not None
            if embed and room is not None:
                n = min(n, room)
                if n <= 0:
                    i += 1  # its chunk waits for the engine's embedding share
                    continue
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
                        return budget, room
            if embed:  # counted once it runs: a sequence that preempted itself runs nothing
                room = None if room is None else room - n
                batch.embed_tokens += n
                batch.embed_rows += 1
            seqs.append(seq)
            num_new.append(n)
            budget -= n
            i += 1
        return budget, room

    def _admit_waiting(self, queue: deque[Seq], batch: ScheduledBatch, budget: int, room: int | None) -> int:
        """Admits from the head of `queue` while the budget (and for embeddings `room`) allows.
        Once an adapter's sequence waits for a slot, only base-model sequences pass it: the adapters'
        keep their order (it takes the next slot that frees), the base model's never wait for one."""
        i, slot_wait = 0, False
        while i < len(queue) and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            seq = queue[i]
            if slot_wait and seq.lora is not None:
                i += 1
                continue
            if seq.leader is not None and not seq.leader.is_finished and seq.leader.in_prefill:
                break  # n > 1 copies wait for the shared prompt to be cached, then reuse it
            if seq.num_pending:
                break  # preempted with a token in flight: recompute once the host has it
            embed = seq.embed
            slot = self._take_slot(seq)
            if slot is None:  # every LoRA slot is held by other adapters' running sequences
                slot_wait = True
                i += 1
                continue
            limit = budget if room is None else min(budget, room)
            if embed is not None and embed.whole:  # an encoder's: the whole prompt at once, no KV blocks
                n = seq.prompt_len if seq.prompt_len <= limit else 0
            else:
                if seq.mm is not None and self.encoder_budget is not None and limit > 0:
                    start = len(self.blocks.match_prefix(seq)) * self.blocks.block_size
                    limit = self._fit_images(seq, start, limit)
                n = self.blocks.admit(seq, limit) if limit > 0 else 0
            if n == 0:
                if slot and self.lora_slots is not None:
                    self.lora_slots.release(slot)  # stays resident (its write is still queued)
                break
            seq.lora_slot = slot
            del queue[i]
            seq.status = SeqStatus.RUNNING
            if seq.scheduled_time is None:  # a preempted sequence keeps its first admission
                seq.scheduled_time = time.monotonic()
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new.append(n)
            budget -= n
            if embed is not None:
                self.running_embeds += 1
                batch.embed_tokens += n
                batch.embed_rows += 1
                if room is not None:
                    room -= n
        return budget

    def _fit_images(self, seq: Seq, start: int, n: int) -> int:
        assert self.encoder_budget is not None
        fresh = self._encoder_left == self.encoder_budget
        n, used = fit_images(seq, start, n, self._encoder_left, fresh)
        if n > 0:
            self._encoder_left -= used
        return n

    def _take_slot(self, seq: Seq) -> int | None:
        """The LoRA slot the sequence runs with (0: the base model), or None: none free now."""
        if seq.lora is None or self.lora_slots is None:
            return 0
        return self.lora_slots.acquire(seq.lora, self._lora_writes)

    def _preempt(self, seq: Seq) -> None:
        self.running.remove(seq)
        self.running_embeds -= seq.embed is not None
        seq.draft_ids = []
        self.blocks.free(seq)
        self._drop_slot(seq)
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.preemptions += 1
        if self.order is not None and seq.embed is None:
            self.order.insert(self.waiting, seq)  # at its place: it keeps its arrival
        else:
            self._queue(seq).appendleft(seq)


def _with_draft(seq: Seq, n: int, budget: int) -> int:
    """Tokens a sequence with a draft feeds: its n known ones, then as much of the draft as
    `budget` leaves room for (the draft is cut to that)."""
    room = budget - n
    if len(seq.draft_ids) > room:
        seq.draft_ids = seq.draft_ids[: max(0, room)]
    return n + len(seq.draft_ids)
