"""Landing a launched step: its tokens, once on the host, turned into deltas (a mixin of EngineCore).

`_land` waits for the step's one device->host copy, then gives each sampled sequence its new token:
appended, checked by its grammar, detokenized, stop-checked and published as one delta; a step
that verified drafts lands through runs.py instead, and the pooled sequences that follow the
sampled ones finish with their vectors. A step whose forward or copy failed fails its sequences,
not the engine. Apart from core.py, which tracks requests and schedules and launches each step:
this is the half of a step that runs once per sampled sequence, on the host, after the device.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

from rillet.core.engine.deltas import token_delta
from rillet.core.engine.handoff.gil_gate import EngineGate
from rillet.core.engine.runs import RunLanding
from rillet.core.errors import ErrorKind
from rillet.core.outputs import SeqDelta
from rillet.core.runner.base import FatalRunnerError, InflightStep, SampleResult
from rillet.core.sequence import FinishReason, Seq, SeqStatus, TokenLogprob
from rillet.core.structured.matcher import GrammarViolation

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Flight:
    """A launched step not yet landed."""

    step: InflightStep
    number: int  # its step number
    # the drafts it verifies, by sequence, as launched: an abort or deadline while it is in flight
    # releases a sequence (its draft_ids cleared), yet its rows are in the result
    verifies: dict[int, list[int]]


@dataclass
class Pending:
    """A sequence's unpublished output of this step."""

    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None


class StepLanding(RunLanding):
    # EngineCore's, read and written here
    _flights: deque[Flight]
    _landed_step: int
    wait_seconds: float
    gate: EngineGate | None

    def abort(
        self,
        request_id: str,
        reason: FinishReason = FinishReason.ABORT,
        error: str | None = None,
        kind: ErrorKind | None = None,
    ) -> list[SeqDelta]:
        raise NotImplementedError

    def _land(self) -> list[SeqDelta]:
        """Waits for the oldest launched step's tokens and post-processes them."""
        flight = self._flights.popleft()
        launched, verifies = flight.step, flight.verifies
        self._landed_step = flight.number
        deltas: list[SeqDelta] = []
        t0 = time.perf_counter()
        gate = self.gate
        if gate is not None:  # the event loop may have the GIL until the step is done
            gate.waiting(launched.ready)  # announced already when the publish came first (core.py)
        try:
            result = launched.wait()
        except FatalRunnerError:
            raise
        except Exception as exc:
            self._fail(launched.seqs, exc, deltas)
            return deltas
        finally:
            if gate is not None:
                gate.working(landed=True)
            self.wait_seconds += time.perf_counter() - t0
            for seq in launched.seqs:
                seq.num_pending -= 1
        for seq, start, lps in result.prompt_lps:
            _add_prompt_lps(seq, start, lps)
        seqs = launched.seqs
        if result.embeddings:  # the pooled sequences follow the sampled ones
            n = len(seqs) - len(result.embeddings)
            sampled, pooled = seqs[:n], seqs[n:]
        else:
            sampled, pooled = seqs, []
        if verifies:
            deltas.extend(self._postprocess_runs(sampled, result, verifies))
        else:
            deltas.extend(self._postprocess(sampled, result))
        if pooled:
            deltas.extend(self._publish_embeddings(pooled, result.embeddings))
        return deltas

    def _fail(self, seqs: list[Seq], exc: Exception, deltas: list[SeqDelta]) -> None:
        log.exception("model step failed; failing %d sequences", len(seqs))
        for seq in list(seqs):
            deltas.extend(
                self.abort(seq.request_id, FinishReason.ERROR, f"model step failed: {exc}", ErrorKind.MODEL)
            )

    def _postprocess(self, sampled: list[Seq], result: SampleResult) -> list[SeqDelta]:
        """Appends, detokenizes and stop-checks each new token; one delta per live sequence.
        Runs once per sampled sequence per step, so attributes are read directly."""
        deltas: list[SeqDelta] = []
        now = time.monotonic()
        block_size, max_len = self.blocks.block_size, self.max_model_len
        detoks, finished = self._detok, SeqStatus.FINISHED
        token_ids, logprobs = result.token_ids, result.logprobs
        appended = 0
        for i, seq in enumerate(sampled):
            if seq.status is finished:
                continue  # stopped at the step before (overlap): this token was never wanted
            token, out = token_ids[i], seq.output_ids
            try:
                out.append(token)
                appended += 1
                if seq.grammar is not None:
                    seq.grammar.accept(token)  # raises for a token the grammar refuses: this request fails
                if seq.first_token_time is None:
                    seq.first_token_time = now
                detok = detoks[seq.seq_id]
                text, reason = detok.add(token, len(out))
                num_tokens = len(seq.prompt_ids) + len(out)
                if reason is None and num_tokens >= max_len:
                    reason = FinishReason.LENGTH
                    text += detok.flush()
                if reason is not None:
                    self._finish(seq, reason)
            except Exception as exc:
                deltas.extend(self._failed_output(seq, exc))
                continue
            lp = logprobs[i]
            lps = None if lp is None else [lp]
            deltas.append(token_delta(seq, [token], text, lps, reason, detok.stop_str))
            # overlap: the new token completed a block that the step in flight has computed
            if num_tokens % block_size == 0 and seq.num_computed >= num_tokens and reason is None:
                self.blocks.commit(seq)
        self.generated_tokens += appended
        return deltas

    def _publish_embeddings(self, seqs: list[Seq], vectors: list[bytes]) -> list[SeqDelta]:
        """Embedding sequences whose last chunk ran: each finishes (its blocks freed: nothing is kept
        for a prompt-only request) with its one delta, which carries the vector."""
        deltas = []
        for seq, vector in zip(seqs, vectors, strict=True):
            if seq.status is SeqStatus.FINISHED:
                continue  # aborted or expired while its step was in flight
            self._finish(seq, FinishReason.STOP)
            delta = self._delta(seq, Pending([], "", None))
            delta.embedding = vector
            deltas.append(delta)
        return deltas

    def _failed_output(self, seq: Seq, exc: Exception) -> list[SeqDelta]:
        log.error("request %s failed in post-processing", seq.request_id, exc_info=exc)
        kind = ErrorKind.GRAMMAR if isinstance(exc, GrammarViolation) else ErrorKind.OUTPUT
        return self.abort(seq.request_id, FinishReason.ERROR, f"{type(exc).__name__}: {exc}", kind)

    def _delta(self, seq: Seq, p: Pending) -> SeqDelta:
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
            error_kind=seq.error_kind,
            scheduled_at=seq.scheduled_time,  # every delta built here is a final one
        )


def _add_prompt_lps(seq: Seq, start: int, lps: list[TokenLogprob]) -> None:
    """Appends a chunk's prompt logprobs where they continue the ones before (a chunk computed
    before a preemption reset the sequence lands once; its recomputation scores nothing again)."""
    have = seq.prompt_lps
    if have is not None and start == len(have):
        have.extend(lps)
