"""Turns a scheduled batch into tensors, runs the model and samples: one launch per engine step.

`launch` queues the whole step on the device (inputs from step_inputs.py, forward, sampling, the
sampled tokens into the future buffer, their copy to the host) and returns an `InflightStep`
without waiting; its `wait()` gives the tokens. On CPU torch runs the ops as they are called, so a
launch there returns once the step is done. The token layout of a step is in step_inputs.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from rillet.core.attention.base import AttentionMetadata, DecodeMetadata
from rillet.core.engine.scheduler import ScheduledBatch
from rillet.core.model.decoder import DecoderModel, KVCache
from rillet.core.runner.sample_output import HostSample
from rillet.core.runner.sampler import Sampler, SampleResult
from rillet.core.runner.step_inputs import InputBuilder, StepInputs
from rillet.core.sequence import Seq
from rillet.core.structured.masks import MaskFiller
from rillet.graphs.interface import DecodeBatch
from rillet.graphs.runner import GraphRunner


class FatalRunnerError(RuntimeError):
    """The runner can run no further step (e.g. a tensor-parallel rank is gone): the engine stops,
    instead of failing this batch alone and going on."""


class InflightStep(Protocol):
    """A launched step: `seqs` are the sequences it samples, in the order of `wait()`'s rows."""

    seqs: list[Seq]

    def wait(self) -> SampleResult: ...


class Runner(Protocol):
    """What the engine needs from a model: launch one scheduled step; forget a finished sequence.

    A launch reads each sequence's host state as it is then (num_computed, tokens, blocks,
    num_pending); a decode whose input token is pending takes it from the previous launch's
    output on the device. Launches run on the device in the order they are made."""

    def launch(self, batch: ScheduledBatch) -> InflightStep: ...

    def release(self, seq: Seq) -> None: ...

    def poll(self) -> None:
        """Between steps, on the engine thread (idle or not): work that must run on the thread
        that runs the model, e.g. timing a freshly compiled decode step (graphs/compiled.py)."""

    def close(self) -> None:
        """The engine has stopped stepping: end background work (a compile in flight finishes
        first: graphs/compiled.py) and helper threads."""


@dataclass
class _Launched:
    seqs: list[Seq]
    host: HostSample

    def wait(self) -> SampleResult:
        return self.host.wait()


class DecoderGraphAdapter:
    """The model as graphs/ sees it (graphs/interface.py): host planning, then a capturable forward.

    A backend with `graph_safe_decode` (torch) gets a `DecodeMetadata` built inside the forward
    from the batch's tensors: nothing to plan, no host list in the traced code, so the compiled
    step never guards on (and never recompiles for) a batch's contents. Others (flashinfer) plan
    an `AttentionMetadata` on the host in prepare_decode and read it in the forward."""

    def __init__(self, model: DecoderModel, kv_caches: list[KVCache], block_size: int) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.graph_safe = bool(getattr(model.backend, "graph_safe_decode", False))
        self.meta: AttentionMetadata | None = None

    def prepare_decode(self, b: DecodeBatch) -> None:
        if self.graph_safe:
            return
        self.meta = AttentionMetadata(
            b.slot_mapping,
            b.query_start,
            b.seq_lens,
            b.block_tables,
            [1] * b.num_rows,
            b.seq_lens_cpu,
            self.block_size,
            num_prefills=0,
        )
        self.model.backend.begin_step(self.meta)

    def forward_decode(self, b: DecodeBatch) -> torch.Tensor:  # [n, H]
        if self.graph_safe:
            meta: AttentionMetadata | DecodeMetadata = DecodeMetadata(
                b.slot_mapping, b.seq_lens, b.block_tables
            )
        else:
            assert self.meta is not None
            meta = self.meta
        return self.model(b.input_ids, b.positions, self.kv_caches, meta)


class ModelRunner:
    """Eager forward for prefill steps; decode-only steps go through the GraphRunner when given
    and it takes them (CUDA-graph replay per bucket on GPU, the compiled step on CPU once built)."""

    def __init__(
        self,
        model: DecoderModel,
        kv_caches: list[KVCache],
        sampler: Sampler,
        block_size: int,
        device: torch.device,
        graph_runner: GraphRunner | None = None,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.sampler = sampler
        self.block_size = block_size
        self.device = device
        self.graph_runner = graph_runner
        self.inputs = InputBuilder(block_size, device)
        self.masks: MaskFiller | None = None  # set when structured outputs are available
        # Tensor parallelism: sends each step's inputs to the other ranks before the forward.
        self.publish_inputs: Callable[[StepInputs], None] | None = None

    def step(self, batch: ScheduledBatch) -> tuple[list[Seq], SampleResult]:
        """One step, synchronously."""
        launched = self.launch(batch)
        return launched.seqs, launched.wait()

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch) -> InflightStep:
        inp = self.inputs.build(batch)
        self.inputs.resolve_future(inp)
        # the grammar masks of this step's constrained rows fill while the model runs
        mask = self.masks.begin(inp.sample_seqs) if self.masks is not None else None
        if self.publish_inputs is not None:
            self.publish_inputs(inp)
        hidden = self._hidden(inp)
        if not inp.sample_seqs:  # prefill chunks that sample nothing yet
            return _Launched([], HostSample(torch.empty(0, dtype=torch.int64), None, 0, None))
        logits = self.model.compute_logits(hidden)  # [S, V]
        sample = self.sampler.sample_device(logits, inp.sample_seqs, mask)
        self.inputs.store_sampled(inp, sample.tokens)
        return _Launched(inp.sample_seqs, sample.start_copy())

    def _hidden(self, inp: StepInputs) -> torch.Tensor:  # [S, H]: the rows that sample
        m = inp.meta
        gr = self.graph_runner
        if gr is not None and m.is_decode_only and gr.takes(m.num_seqs):
            hidden = gr.run(
                DecodeBatch(
                    inp.input_ids,
                    inp.positions,
                    m.slot_mapping,
                    m.seq_lens,
                    m.block_tables,
                    m.query_start,
                    m.seq_lens_cpu,
                )
            )  # [B, H], one row per sequence in batch order (T = B)
        else:
            self.model.backend.begin_step(m)
            hidden = self.model(inp.input_ids, inp.positions, self.kv_caches, m)  # [T, H]
        if not inp.sample_seqs:
            return hidden[:0]
        if len(inp.sample_seqs) < hidden.shape[0]:
            # rows that sample only; in a decode-only step too: a 1-token prompt chunk that is
            # not the prompt's end looks like a decode row but samples nothing
            hidden = hidden.index_select(0, inp.sample_rows)
        return hidden

    def release(self, seq: Seq) -> None:
        self.sampler.release(seq.seq_id)
        self.inputs.release(seq)

    def poll(self) -> None:
        if self.graph_runner is not None:
            self.graph_runner.poll()

    def close(self) -> None:
        if self.graph_runner is not None:
            self.graph_runner.stop()  # a background compile ends at its next phase
        if self.masks is not None:
            self.masks.close()
