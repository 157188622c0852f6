"""The null engine: deterministic tokens, a fixed step time, no compute.

Two modes:
  synchronous (default): a launch sleeps the step time (as a blocking GPU wait would, releasing
    the GIL) and returns with the tokens ready; no inputs are built.
  asynchronous (`model.synthetic_async`): a launch does the host work a GPU engine does (the step's
    inputs from step_inputs.py, on CPU tensors) and returns at once; the step runs on a simulated
    device timeline: it starts when the previous step ends (or now, if the device is idle), and its
    tokens are readable `synthetic_step_ms` later, which is when `wait()` returns.

The next token depends only on the sequence's prompt, choice index and position, so outputs are the
same batched or alone, streamed or not, overlapped or not. Tokens come from `token_pool` (ordinary
text tokens).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .model_runner import InflightStep
from .request import Sequence
from .sampler import SampleResult
from .scheduler import ScheduledBatch
from .step_inputs import InputBuilder


@dataclass
class _Timed:
    seqs: list[Sequence]
    token_ids: list[int]
    ready_at: float  # time.perf_counter() at which the simulated device has finished the step

    def wait(self) -> SampleResult:
        left = self.ready_at - time.perf_counter()
        if left > 0:
            time.sleep(left)  # like a GPU wait: releases the GIL
        return SampleResult(self.token_ids, [None] * len(self.token_ids))


class SyntheticRunner:
    def __init__(
        self, step_ms: float, token_pool: list[int], asynchronous: bool = False, block_size: int = 16
    ) -> None:
        self.step_s = step_ms / 1000.0
        self.pool = token_pool
        self.asynchronous = asynchronous
        self.inputs = InputBuilder(block_size, torch.device("cpu")) if asynchronous else None
        self._device_free_at = 0.0  # when the simulated device finishes the last launched step

    def step(self, batch: ScheduledBatch) -> tuple[list[Sequence], SampleResult]:
        launched = self.launch(batch)
        return launched.seqs, launched.wait()

    def launch(self, batch: ScheduledBatch) -> InflightStep:
        if self.inputs is None:
            if self.step_s > 0:
                time.sleep(self.step_s)
            seqs = [
                s
                for s, n in zip(batch.seqs, batch.num_new, strict=True)
                if s.num_computed + n == s.num_scheduled_tokens
            ]
            return _Timed(seqs, self._tokens(seqs), 0.0)
        inp = self.inputs.build(batch)
        ids = self._tokens(inp.sample_seqs)
        if ids:
            self.inputs.store_sampled(inp, torch.tensor(ids, dtype=torch.int64))
        start = max(time.perf_counter(), self._device_free_at)
        self._device_free_at = start + self.step_s
        return _Timed(inp.sample_seqs, ids, self._device_free_at)

    def _tokens(self, seqs: list[Sequence]) -> list[int]:
        """A sampling sequence's next token sits at position num_scheduled_tokens."""
        pool = self.pool
        return [
            pool[(s.num_scheduled_tokens * 7919 + s.prompt_ids[0] + s.index * 104729) % len(pool)]
            for s in seqs
        ]

    def release(self, seq: Sequence) -> None:
        if self.inputs is not None:
            self.inputs.release(seq)
