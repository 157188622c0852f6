"""One engine step: schedule, launch, sample, detokenize, stop, publish deltas.

Synchronously (overlap off) a step lands the step it launched: its tokens are post-processed before
the next step is scheduled. With overlap on (core/overlap.py) a step lands the previous one after
launching its own, so the host's work on step N runs while the device runs step N+1.
Threading lives in engine.py; this class is driven by exactly one thread and holds no locks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from .block_manager import BlockManager
from .detokenizer import IncrementalDetokenizer
from .model_runner import InflightStep, Runner
from .outputs import SeqDelta, StepOutput
from .overlap import needs_host_tokens
from .request import FinishReason, SeqStatus, Sequence, TokenLogprob
from .sampler import SampleResult
from .scheduler import ScheduledBatch, Scheduler

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    """A sequence's unpublished output of this step."""

    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None


class EngineCore:
    def __init__(
        self,
        scheduler: Scheduler,
        runner: Runner,
        make_detokenizer: Callable[[Sequence], IncrementalDetokenizer],
        max_model_len: int,
        overlap: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.blocks: BlockManager = scheduler.blocks
        self.runner = runner
        self.make_detokenizer = make_detokenizer
        self.max_model_len = max_model_len
        self.seqs: dict[str, list[Sequence]] = {}  # request_id -> its live choices
        self._detok: dict[int, IncrementalDetokenizer] = {}
        self.overlap = overlap
        self._inflight: InflightStep | None = None  # launched, not yet landed (overlap only)
        self._inflight_step = 0  # its step number
        self._landed_step = 0  # the number of the step whose tokens were post-processed last
        self._host_token_seqs = 0  # live sequences that make overlapped steps synchronous
        self.steps = 0
        self.generated_tokens = 0
        self.wait_seconds = 0.0  # time blocked waiting for launched steps' tokens
        # Fault injection for tests: request ids whose post-processing raises.
        self.fail_request_ids: set[str] = set()

    # ---- requests ----------------------------------------------------------------------------
    def add(self, seqs: list[Sequence]) -> None:
        # Detokenizers first: if one cannot be built, nothing of the request is registered yet.
        detoks = [self.make_detokenizer(seq) for seq in seqs]
        self.seqs[seqs[0].request_id] = seqs
        for seq, detok in zip(seqs, detoks, strict=True):
            self._detok[seq.seq_id] = detok
            self._host_token_seqs += needs_host_tokens(seq)
            self.scheduler.add(seq)

    def reject(self, seqs: list[Sequence], error: str) -> list[SeqDelta]:
        """A request `add` raised for: it never entered the scheduler; tell its client."""
        self.seqs.pop(seqs[0].request_id, None)
        deltas = []
        for seq in seqs:
            self._detok.pop(seq.seq_id, None)
            seq.status, seq.finish_reason, seq.error = SeqStatus.FINISHED, FinishReason.ERROR, error
            deltas.append(self._delta(seq, _Pending([], "", None)))
        return deltas

    def abort(
        self, request_id: str, reason: FinishReason = FinishReason.ABORT, error: str | None = None
    ) -> list[SeqDelta]:
        deltas = []
        for seq in self.seqs.get(request_id, []):
            if not seq.is_finished:
                seq.error = error
                self._finish(seq, reason)
                deltas.append(self._delta(seq, _Pending([], "", None)))
        self.seqs.pop(request_id, None)
        return deltas

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    def has_work(self) -> bool:
        return self._inflight is not None or self.scheduler.has_work()

    # ---- the step ----------------------------------------------------------------------------
    def step(self, before_run: Callable[[], None] | None = None) -> StepOutput | None:
        """One scheduling + launch step. `before_run` is called once the batch is scheduled, just
        before it is launched (not at all when nothing is scheduled): the engine publishes the
        previous step's output there, so the front end's work on it overlaps the device's work
        instead of competing with the scheduling for the GIL."""
        deltas = self._expire_deadlines()
        if self._inflight is not None and self._host_token_seqs:
            deltas.extend(self._land())  # synchronous fallback (core/overlap.py)
        batch = self.scheduler.schedule()
        launched = None
        if batch.seqs:
            self.steps += 1
            if before_run is not None:
                before_run()
            launched = self._launch(batch, deltas)
        if self._inflight is not None:
            deltas.extend(self._land())
        self._inflight, self._inflight_step = launched, self.steps
        if not self.overlap and launched is not None:
            deltas.extend(self._land())
        # numbered by the step whose tokens it carries (the front end's inter-token clock)
        return StepOutput(self._landed_step, deltas) if batch.seqs or deltas else None

    def _launch(self, batch: ScheduledBatch, deltas: list[SeqDelta]) -> InflightStep | None:
        try:
            launched = self.runner.launch(batch)
        except Exception as exc:  # a failed forward fails this batch, not the engine
            self._fail(batch.seqs, exc, deltas)
            return None
        for seq, n in zip(batch.seqs, batch.num_new, strict=True):
            seq.num_computed += n
            self.blocks.commit(seq)
        for seq in launched.seqs:
            seq.num_pending += 1
        return launched

    def _land(self) -> list[SeqDelta]:
        """Waits for the launched step's tokens and post-processes them."""
        launched, self._inflight = self._inflight, None
        assert launched is not None
        self._landed_step = self._inflight_step
        deltas: list[SeqDelta] = []
        t0 = time.perf_counter()
        try:
            result = launched.wait()
        except Exception as exc:
            self._fail(launched.seqs, exc, deltas)
            return deltas
        finally:
            self.wait_seconds += time.perf_counter() - t0
            for seq in launched.seqs:
                seq.num_pending -= 1
        deltas.extend(self._postprocess(launched.seqs, result))
        return deltas

    def _fail(self, seqs: list[Sequence], exc: Exception, deltas: list[SeqDelta]) -> None:
        log.exception("model step failed; failing %d sequences", len(seqs))
        for seq in list(seqs):
            deltas.extend(self.abort(seq.request_id, FinishReason.ERROR, f"model step failed: {exc}"))

    def _postprocess(self, sampled: list[Sequence], result: SampleResult) -> list[SeqDelta]:
        deltas: list[SeqDelta] = []
        now = time.monotonic()
        block_size = self.blocks.block_size
        for i, seq in enumerate(sampled):
            if seq.is_finished:
                continue  # stopped at the step before (overlap): this token was never wanted
            try:
                if seq.request_id in self.fail_request_ids:
                    raise RuntimeError("injected fault")
                pending = self._append_token(seq, result.token_ids[i], result.logprobs[i], now)
            except Exception as exc:
                log.exception("request %s failed in post-processing", seq.request_id)
                deltas.extend(self.abort(seq.request_id, FinishReason.ERROR, f"{type(exc).__name__}: {exc}"))
                continue
            if pending is not None:
                deltas.append(self._delta(seq, pending))
            # overlap: the new token completed a block that the step in flight has computed
            full = seq.num_tokens % block_size == 0 and seq.num_computed >= seq.num_tokens
            if full and seq.status is SeqStatus.RUNNING:
                self.blocks.commit(seq)
        return deltas

    def _append_token(
        self, seq: Sequence, token: int, logprob: TokenLogprob | None, now: float
    ) -> _Pending | None:
        seq.output_ids.append(token)
        self.generated_tokens += 1
        if seq.first_token_time is None:
            seq.first_token_time = now
        text, reason = self._detok[seq.seq_id].add(token, len(seq.output_ids))
        if reason is None and seq.num_tokens >= self.max_model_len:
            reason = FinishReason.LENGTH
            text += self._detok[seq.seq_id].flush()
        if reason is not None:
            self._finish(seq, reason)
        return _Pending([token], text, [logprob] if logprob is not None else None)

    # ---- finishing ---------------------------------------------------------------------------
    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        self._host_token_seqs -= needs_host_tokens(seq)
        self.scheduler.finish(seq, reason)
        self.runner.release(seq)
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
            deltas.extend(self.abort(rid, FinishReason.ERROR, "request deadline exceeded"))
        return deltas

    def _delta(self, seq: Sequence, p: _Pending) -> SeqDelta:
        return SeqDelta(
            request_id=seq.request_id,
            index=seq.index,
            token_ids=p.token_ids,
            text=p.text,
            logprobs=p.logprobs,
            finish_reason=seq.finish_reason if seq.status is SeqStatus.FINISHED else None,
            prompt_tokens=seq.prompt_len,
            cached_tokens=seq.num_cached,
            completion_tokens=len(seq.output_ids),
            error=seq.error,
        )
