"""What the engine needs from a model runner, and the errors a runner raises.

A runner launches one scheduled step at a time and hands back an `InflightStep` whose `wait()`
gives the sampled tokens; launches run on the device in the order they are made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from rillet.core.engine.scheduler import ScheduledBatch
from rillet.core.sequence import Seq, TokenLogprob


@dataclass(slots=True)
class SampleResult:
    token_ids: list[int]  # one per row, in the order of the seqs passed to `sample`
    logprobs: list[TokenLogprob | None]  # None where the row's params.logprobs is None
    # Embedding sequences pooled by the step (after the sampled ones in InflightStep.seqs): one
    # vector each, little-endian float32 bytes (SeqDelta.embedding)
    embeddings: list[bytes] = field(default_factory=list)
    # params.prompt_logprobs: (sequence, position of the first scored row, logprobs of the prompt
    # tokens after that row and the rows next to it) per prefill chunk that owed them
    prompt_lps: list[tuple[Seq, int, list[TokenLogprob]]] = field(default_factory=list)


class FatalRunnerError(RuntimeError):
    """The runner can run no further step (e.g. a tensor-parallel rank is gone): the engine stops,
    instead of failing this batch alone and going on."""


class InflightStep(Protocol):
    """A launched step: `seqs` are the sequences it samples, in the order of `wait()`'s token rows,
    then the embedding sequences it pools, in the order of `wait()`'s embeddings."""

    seqs: list[Seq]

    def wait(self) -> SampleResult: ...

    def ready(self) -> bool:
        """True once the device is known to have finished the step; any thread may ask (the event
        loop's probe, engine/handoff/gil_gate.py)."""
        ...


class Runner(Protocol):
    """What the engine needs from a model: launch one scheduled step; forget a finished sequence.

    A launch reads each sequence's host state as it is then (num_computed, tokens, blocks,
    num_pending); a decode whose input token is pending takes it from the previous launch's
    output on the device. Launches run on the device in the order they are made."""

    def launch(self, batch: ScheduledBatch) -> InflightStep: ...

    def release(self, seq: Seq) -> None: ...

    def poll(self) -> None:
        """Between steps, on the engine thread (idle or not): work that must run on the thread
        that runs the model, e.g. timing a freshly compiled decode step (graphs/speed_check.py)."""

    def close(self) -> None:
        """The engine has stopped stepping: end background work (a compile in flight finishes
        first: graphs/compiled.py) and helper threads."""
