"""The null engine: deterministic tokens, a fixed step time, no compute.

Two modes:
  synchronous (default): a launch sleeps the step time (as a blocking GPU wait would, releasing
    the GIL) and returns with the tokens ready; no inputs are built.
  asynchronous (`model.synthetic_async`): a launch does the host work a GPU engine does (the step's
    inputs from input_builder.py, on CPU tensors) and returns at once; the step runs on a simulated
    device timeline: it starts when the previous step ends (or now, if the device is idle), and its
    tokens are readable `synthetic_step_ms` later, which is when `wait()` returns.

The next token depends only on the sequence's prompt, choice index and position, so outputs are the
same batched or alone, streamed or not, overlapped or not. Tokens come from `token_pool` (ordinary
text tokens).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from rillet.core.engine.scheduler import ScheduledBatch
from rillet.core.runner.base import InflightStep, SampleResult
from rillet.core.runner.input_builder import InputBuilder
from rillet.core.sequence import Seq

SYNTHETIC_EMBEDDING_SIZE = 64  # components of the null engine's embeddings (model.task embed / both)


@dataclass
class _Timed:
    seqs: list[Seq]  # sampled, then pooled (embedding sequences)
    pool: list[int]
    ready_at: float  # time.perf_counter() at which the simulated device has finished the step
    num_sampled: int = -1  # seqs[:num_sampled] sample; -1: all of them

    def ready(self) -> bool:
        return time.perf_counter() >= self.ready_at

    def wait(self) -> SampleResult:
        # The "device" computes the tokens: before the wait, so that this host work is hidden
        # under the step time as a GPU's sampling would be. Each sequence's host state is exact
        # here: every earlier step has landed, this one's token is not appended yet.
        n = len(self.seqs) if self.num_sampled < 0 else self.num_sampled
        ids = synthetic_tokens(self.seqs[:n], self.pool)
        vectors = [synthetic_embedding(s) for s in self.seqs[n:]]
        left = self.ready_at - time.perf_counter()
        if left > 0:
            time.sleep(left)  # like a GPU wait: releases the GIL
        return SampleResult(ids, [None] * len(ids), vectors)


def synthetic_embedding(seq: Seq) -> bytes:
    """A unit vector that depends only on the prompt (and `dimensions`): little-endian float32."""
    seed = hash(tuple(seq.prompt_ids)) & 0xFFFFFFFF
    v = np.random.default_rng(seed).standard_normal(SYNTHETIC_EMBEDDING_SIZE).astype("<f4")
    dims = seq.embed.dimensions if seq.embed is not None else None
    v = v[: dims or SYNTHETIC_EMBEDDING_SIZE]
    return (v / np.linalg.norm(v)).astype("<f4").tobytes()


def synthetic_tokens(seqs: list[Seq], pool: list[int]) -> list[int]:
    """The token after each sequence's host-known tokens (the one the step samples)."""
    size = len(pool)
    return [
        pool[((len(s.prompt_ids) + len(s.output_ids)) * 7919 + s.prompt_ids[0] + s.index * 104729) % size]
        for s in seqs
    ]


class SyntheticRunner:
    def __init__(
        self,
        step_ms: float,
        token_pool: list[int],
        asynchronous: bool = False,
        block_size: int = 16,
        host_ms: float = 0.0,
    ) -> None:
        self.step_s = step_ms / 1000.0
        self.host_s = host_ms / 1000.0
        self.pool = token_pool
        self.asynchronous = asynchronous
        self.inputs = InputBuilder(block_size, torch.device("cpu")) if asynchronous else None
        self._device_free_at = 0.0  # when the simulated device finishes the last launched step

    def step(self, batch: ScheduledBatch) -> tuple[list[Seq], SampleResult]:
        launched = self.launch(batch)
        return launched.seqs, launched.wait()

    def launch(self, batch: ScheduledBatch) -> InflightStep:
        if self.inputs is None:
            if self.step_s > 0:
                time.sleep(self.step_s)
            ended = [
                s
                for s, n in zip(batch.seqs, batch.num_new, strict=True)
                if s.num_computed + n == s.num_scheduled_tokens
            ]
            sampled = [s for s in ended if s.embed is None]
            pooled = [s for s in ended if s.embed is not None] if len(sampled) < len(ended) else []
            return _Timed(sampled + pooled, self.pool, 0.0, len(sampled))
        inp = self.inputs.build(batch)
        if self.host_s > 0:
            _hold_gil(self.host_s)
        start = max(time.perf_counter(), self._device_free_at)
        self._device_free_at = start + self.step_s
        pooled = [p.seq for p in inp.pool if p.last]
        return _Timed(inp.sample_seqs + pooled, self.pool, self._device_free_at, len(inp.sample_seqs))

    def release(self, seq: Seq) -> None:
        if self.inputs is not None:
            self.inputs.release(seq)

    def poll(self) -> None:
        pass  # nothing to do between steps

    def close(self) -> None:
        pass  # no background work


def _hold_gil(seconds: float) -> None:
    """Busy Python for `seconds`: the GIL is held, given up only at the interpreter's switch
    interval when another thread asks for it (as bytecode-bound host work does)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
