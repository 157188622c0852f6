"""One engine step: schedule, launch, sample, detokenize, stop, publish deltas.

Synchronously (overlap off) a step lands the step it launched: its tokens are post-processed before
the next step is scheduled. With overlap on (core/engine/overlap.py) a step lands the previous one after
launching its own, so the host's work on step N runs while the device runs step N+1.
Threading lives in engine.py; this class is driven by exactly one thread and holds no locks.

Speculative decoding (core/spec/): before scheduling, the speculator gives decoding sequences a
draft; the step verifies it and lands through runs.py. A step that may speculate, or that
verified drafts, is landed before the next one is scheduled.

Here: the requests (add, reject, abort, finish, deadlines) and scheduling and launching a step;
landing its tokens (waiting for them, post-processing, the deltas) is in landing.py.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.detokenizer import IncrementalDetokenizer
from rillet.core.engine.handoff.gil_gate import EngineGate
from rillet.core.engine.landing import Flight, Pending, StepLanding
from rillet.core.engine.overlap import needs_host_tokens
from rillet.core.engine.scheduler import ScheduledBatch, Scheduler
from rillet.core.engine.scheduling.embed_share import EmbedShare
from rillet.core.errors import ErrorKind
from rillet.core.outputs import SeqDelta, StepOutput
from rillet.core.runner.base import FatalRunnerError, InflightStep, Runner
from rillet.core.sequence import FinishReason, Seq, SeqStatus
from rillet.core.spec.speculator import Speculator


class EngineCore(StepLanding):
    def __init__(
        self,
        scheduler: Scheduler,
        runner: Runner,
        make_detokenizer: Callable[[Seq], IncrementalDetokenizer],
        max_model_len: int,
        overlap: bool = False,
        spec: Speculator | None = None,
        serves_both: bool = False,
        overlap_depth: int = 1,
    ) -> None:
        """`serves_both`: chat and embeddings share this engine (model.task both); `overlap_depth`:
        the steps left in flight with overlap on (engine.overlap_depth)."""
        self.scheduler = scheduler
        self.blocks: BlockManager = scheduler.blocks
        self.runner = runner
        self.make_detokenizer = make_detokenizer
        self.max_model_len = max_model_len
        self.seqs: dict[str, list[Seq]] = {}  # request_id -> its live choices
        self._detok: dict[int, IncrementalDetokenizer] = {}
        # steps left in flight after a step (overlap.py): 0 = overlap off, else engine.overlap_depth
        self.depth = overlap_depth if overlap else 0
        self._flights: deque[Flight] = deque()  # launched, not yet landed, oldest first
        self.spec = spec
        self._landed_step = 0  # the number of the step whose tokens were post-processed last
        self._host_token_seqs = 0  # live sequences that make overlapped steps synchronous
        self.steps = 0
        self.generated_tokens = 0
        self.wait_seconds = 0.0  # time blocked waiting for launched steps' tokens
        self.gate: EngineGate | None = None  # the event loop gives way to host work (handoff/gil_gate.py)
        share = scheduler.cfg.embed_share
        # chat vs embeddings (embed_share.py); an engine that only embeds runs them unbounded
        self.embed_share = EmbedShare(share) if share < 1 and serves_both else None

    # ---- requests ----------------------------------------------------------------------------
    def add(self, seqs: list[Seq]) -> None:
        # Detokenizers first: if one cannot be built, nothing of the request is registered yet.
        detoks = [self.make_detokenizer(seq) if seq.embed is None else None for seq in seqs]
        self.seqs[seqs[0].request_id] = seqs
        for seq, detok in zip(seqs, detoks, strict=True):
            if detok is not None:  # an embedding publishes a vector, no text
                self._detok[seq.seq_id] = detok
            self._host_token_seqs += needs_host_tokens(seq)
            self.scheduler.add(seq)

    def reject(self, seqs: list[Seq], error: str) -> list[SeqDelta]:
        """A request `add` raised for: it never entered the scheduler; tell its client."""
        self.seqs.pop(seqs[0].request_id, None)
        deltas = []
        for seq in seqs:
            self._detok.pop(seq.seq_id, None)
            seq.status, seq.finish_reason = SeqStatus.FINISHED, FinishReason.ERROR
            seq.error, seq.error_kind = error, ErrorKind.REJECTED
            deltas.append(self._delta(seq, Pending([], "", None)))
        return deltas

    def abort(
        self,
        request_id: str,
        reason: FinishReason = FinishReason.ABORT,
        error: str | None = None,
        kind: ErrorKind | None = None,
    ) -> list[SeqDelta]:
        """Ends every live choice of the request; an ERROR carries its text and kind."""
        deltas = []
        for seq in self.seqs.get(request_id, []):
            if not seq.is_finished:
                seq.error, seq.error_kind = error, kind
                self._finish(seq, reason)
                deltas.append(self._delta(seq, Pending([], "", None)))
        self.seqs.pop(request_id, None)
        return deltas

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting) + len(self.scheduler.waiting_embed)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    def has_work(self) -> bool:
        return bool(self._flights) or self.scheduler.has_work()

    # ---- the step ----------------------------------------------------------------------------
    def step(
        self, before_run: Callable[[], None] | None = None, after_launch: Callable[[], None] | None = None
    ) -> StepOutput | None:
        """One scheduling + launch step. `before_run` is called once the batch is scheduled, just
        before it is launched, `after_launch` just after (neither when nothing is scheduled): the
        engine publishes the previous step's output in one of them (engine/handoff/publisher.py),
        so the front end's work on it overlaps the device's work instead of competing with the
        scheduling for the GIL."""
        t0 = time.perf_counter()
        deltas = self._expire_deadlines()
        spec = self.spec
        if self._flights and (
            self._host_token_seqs
            or any(f.verifies for f in self._flights)
            or (spec is not None and spec.active(len(self.scheduler.running)))
        ):
            while self._flights:  # synchronous fallback (core/engine/overlap.py)
                deltas.extend(self._land())
        share = self.embed_share if self.scheduler.num_embeds else None
        if share is not None:
            self.scheduler.embed_cap = share.cap(self.scheduler.has_generation, t0)
        if spec is not None:
            spec.propose(self.scheduler.running)
        batch = self._schedule(share)
        launched = None
        verifies: dict[int, list[int]] = {}
        if batch.seqs:
            self.steps += 1
            if before_run is not None:
                before_run()
            launched = self._launch(batch, deltas)
            if spec is not None and launched is not None:  # before anything can abort one of them
                verifies = {s.seq_id: s.draft_ids for s in batch.seqs if s.draft_ids}
            if after_launch is not None:
                after_launch()
                self._waits_next(launched)
        if launched is None:
            if self._flights:  # nothing new to run: the oldest in flight is landed all the same
                deltas.extend(self._land())
        else:
            self._flights.append(Flight(launched, self.steps, verifies))
            while len(self._flights) > self.depth:  # oldest first: depth 0 lands this one
                deltas.extend(self._land())
        if share is not None and batch.seqs:
            rows = len(batch.seqs) - batch.embed_rows
            share.observe(
                time.perf_counter() - t0, batch.embed_tokens, rows, batch.num_tokens - batch.embed_tokens
            )
        # numbered by the step whose tokens it carries (the front end's inter-token clock)
        return StepOutput(self._landed_step, deltas) if batch.seqs or deltas else None

    def _schedule(self, share: EmbedShare | None) -> ScheduledBatch:
        batch = self.scheduler.schedule()
        if share is None or batch.seqs or self._flights or not self.scheduler.has_generation:
            return batch
        # Chat is in the engine and none of it can run: it waits for blocks (or batch places) that
        # embeddings mid-prefill hold, and the share holds those back until chat steps earn it
        # credit, which none will. Without this, nothing ever runs again: the embeddings go on.
        self.scheduler.embed_cap = None
        again = self.scheduler.schedule()
        again.preempted[:0] = batch.preempted
        return again

    def _waits_next(self, launched: InflightStep | None) -> None:
        """Just after publishing, when the engine's next act is a device wait (landing the step in
        flight, or this one): the loop may run from here on. Marked at `_land` only, the loop
        woken by the publish would more often find the engine still working and park for nothing.
        Not before the publish: a loop parked mid-pass would resume and hold up the publish."""
        gate = self.gate
        if gate is None or launched is None or (self.depth and len(self._flights) < self.depth):
            return  # with fewer steps in flight than the depth, the engine schedules the next one
        awaited = self._flights[0].step if self._flights else launched
        gate.waiting(awaited.ready)

    def _launch(self, batch: ScheduledBatch, deltas: list[SeqDelta]) -> InflightStep | None:
        try:
            launched = self.runner.launch(batch)
        except FatalRunnerError:
            raise
        except Exception as exc:  # a failed forward fails this batch, not the engine
            self._fail(batch.seqs, exc, deltas)
            return None
        block_size = self.blocks.block_size
        for seq, n in zip(batch.seqs, batch.num_new, strict=True):
            seq.num_computed += n
            known = min(seq.num_computed, len(seq.prompt_ids) + len(seq.output_ids))
            if n > 1 or known % block_size == 0:  # else no block can have filled up
                self.blocks.commit(seq)
        for seq in launched.seqs:
            seq.num_pending += 1
        return launched

    # ---- finishing ---------------------------------------------------------------------------
    def _finish(self, seq: Seq, reason: FinishReason) -> None:
        self._host_token_seqs -= needs_host_tokens(seq)
        self.scheduler.finish(seq, reason)
        self.runner.release(seq)
        if self.spec is not None:
            self.spec.release(seq)
        self._detok.pop(seq.seq_id, None)
        group = self.seqs.get(seq.request_id)
        if group is not None and all(s.is_finished for s in group):
            del self.seqs[seq.request_id]

    def _expire_deadlines(self) -> list[SeqDelta]:
        deltas: list[SeqDelta] = []
        if not self.seqs:
            return deltas
        now = time.monotonic()
        expired = [
            rid
            for rid, group in self.seqs.items()
            if group[0].deadline is not None and now > group[0].deadline
        ]
        for rid in expired:
            deltas.extend(
                self.abort(rid, FinishReason.ERROR, "request deadline exceeded", ErrorKind.DEADLINE)
            )
        return deltas
