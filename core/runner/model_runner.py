"""Turns a scheduled batch into tensors, runs the model and samples: one launch per engine step.

`launch` queues the whole step on the device (inputs from input_builder.py, forward, sampling, the
sampled tokens into the future buffer, their copy to the host) and returns an `InflightStep`
without waiting; its `wait()` gives the tokens. On CPU torch runs the ops as they are called, so a
launch there returns once the step is done. The token layout of a step is in step_inputs.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from rillet.core.attention.base import VerifyMetadata
from rillet.core.engine.scheduler import ScheduledBatch
from rillet.core.model.decoder import DecoderModel, KVCache, MmEmbeds
from rillet.core.runner.base import InflightStep, SampleResult
from rillet.core.runner.inflight.device_timeline import DeviceTimeline, StepMarks
from rillet.core.runner.inflight.sample_output import DeviceSample, HostSample
from rillet.core.runner.input_builder import InputBuilder
from rillet.core.runner.pooling import ChunkPooler, Pooled
from rillet.core.runner.prompt_logprobs import prompt_logprobs
from rillet.core.runner.sampler import Sampler
from rillet.core.runner.step_inputs import StepInputs
from rillet.core.runner.verify_rounds import Ready, round_rows, sample_in_rounds
from rillet.core.sequence import Seq, TokenLogprob
from rillet.core.spec.grammar import verify_masks
from rillet.core.spec.verify_layout import padded_verify_batch
from rillet.core.spec.views import position_views
from rillet.core.structured.masks import MaskFiller, PendingMask
from rillet.core.vision.mm_step import VisionStep
from rillet.graphs.interface import DecodeBatch
from rillet.graphs.runner import GraphRunner


@dataclass
class _Launched:
    seqs: list[Seq]  # the sampled ones, then the pooled ones
    host: HostSample | Ready
    pooled: Pooled | None = None
    prompt_lps: list[tuple[Seq, int, list[TokenLogprob]]] = field(default_factory=list)
    timed: tuple[DeviceTimeline, StepMarks] | None = None  # CUDA: the step's device span

    @property
    def done(self) -> torch.cuda.Event | None:
        """The event after the step's copy to the host (CUDA), None where there is none."""
        return self.host.done if isinstance(self.host, HostSample) else None

    def ready(self) -> bool:
        done = self.done
        return done is None or done.query()

    def wait(self) -> SampleResult:
        done = None
        try:
            result = self.host.wait()
            done = self.done
        finally:
            if self.timed is not None:
                timeline, marks = self.timed
                timeline.end(marks, done)  # a failed wait is not measured
        if self.pooled is not None:
            result.embeddings = self.pooled.to_host()
        result.prompt_lps = self.prompt_lps
        return result


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
        # CUDA: the device's busy and idle time across steps, for /metrics (inflight/device_timeline.py)
        self.timeline = DeviceTimeline() if device.type == "cuda" else None
        self.masks: MaskFiller | None = None  # set when structured outputs are available
        # model.task embed / both: embedding sequences are pooled instead of sampled
        self.pooler: ChunkPooler | None = None
        # A vision-language model's image inputs of each step (core/vision/mm_step.py); None: text only
        self.vision: VisionStep | None = None
        # Tensor parallelism: sends each step's inputs to the other ranks before the forward.
        self.publish_inputs: Callable[[StepInputs], None] | None = None

    def step(self, batch: ScheduledBatch) -> tuple[list[Seq], SampleResult]:
        """One step, synchronously."""
        launched = self.launch(batch)
        return launched.seqs, launched.wait()

    def launch(self, batch: ScheduledBatch) -> InflightStep:
        if self.timeline is None:
            return self._launch(batch)
        marks = self.timeline.begin()  # before the step's first device work
        try:
            launched = self._launch(batch, marks)
        except BaseException:
            self.timeline.end(marks, None)
            raise
        launched.timed = (self.timeline, marks)
        self.timeline.launched(marks, launched.done)
        return launched

    @torch.inference_mode()
    def _launch(self, batch: ScheduledBatch, marks: StepMarks | None = None) -> _Launched:
        if batch.lora_writes:
            self._write_adapters(batch)
        inp = self.inputs.build(batch)
        self.inputs.resolve_future(inp)
        rows, seqs = inp.sample_seqs, inp.sample_seqs
        mask: PendingMask | None = None
        if inp.sample_offsets is not None:  # verifies drafts: each position sampled as a plain step
            rows = position_views(seqs, inp.sample_offsets)
            seqs = list(dict.fromkeys(seqs))  # once per sequence, in row order
            if self.masks is not None:
                mask = verify_masks(self.masks, inp.sample_seqs, inp.sample_offsets)
        elif self.masks is not None:  # the grammar masks of the constrained rows fill while the model runs
            mask = self.masks.begin(rows)
        if self.publish_inputs is not None:
            self.publish_inputs(inp)
        pooled_seqs: list[Seq] = []
        pooled: Pooled | None = None
        if marks is not None and self.timeline is not None:
            self.timeline.forward(marks)
        positions, mm = (
            (inp.positions, None) if self.vision is None else self.vision.inputs(batch, inp.positions)
        )
        if self.vision is not None:  # Gemma 3's images attend bidirectionally within each
            inp.meta.image_blocks = self.vision.image_blocks(batch)
        multi = self.publish_inputs is None and self.vision is None
        hidden = self._multi_query_hidden(inp) if multi else None
        if hidden is None:  # the flat layout: [T, H], every token of the step
            hidden = self._hidden(inp, positions, mm)
            if inp.pool:
                pooled_seqs, pooled = self._pool(hidden, inp)
        prompt_lps = (
            prompt_logprobs(self.model.compute_logits, hidden, inp.prompt_lps) if inp.prompt_lps else []
        )
        sampled = _sample_rows(hidden, inp)
        if not rows:  # prefill chunks that sample nothing yet, embeddings
            empty = HostSample(torch.empty(0, dtype=torch.int64), None, 0, None)
            return _Launched(pooled_seqs, empty, pooled, prompt_lps)
        argmax_only = self.sampler.argmax_only(rows)
        # plain greedy rows (no grammar: no mask) take their tokens without [rows, vocab] logits
        greedy = self.model.greedy_tokens if argmax_only else None
        if inp.sample_offsets is not None and self.device.type == "cpu":  # verify_rounds.py
            result, tokens = sample_in_rounds(
                self.model.compute_logits,
                self.sampler,
                sampled,
                rows,
                inp.sample_seqs,
                inp.sample_offsets,
                mask,
                round_rows(self.model.head_per_row_block(argmax_only)),
                greedy,
            )
            self.inputs.store_sampled(inp, tokens)
            return _Launched(seqs + pooled_seqs, Ready(result), pooled, prompt_lps)
        if greedy is not None and mask is None:
            sample = DeviceSample(greedy(sampled))
        else:
            logits = self.model.compute_logits(sampled)  # [S, V]
            sample = self.sampler.sample_device(logits, rows, mask)
        self.inputs.store_sampled(inp, sample.tokens)
        copy = sample.start_copy(timing=self.timeline is not None)
        return _Launched(seqs + pooled_seqs, copy, pooled, prompt_lps)

    def _pool(self, hidden: torch.Tensor, inp: StepInputs) -> tuple[list[Seq], Pooled | None]:
        if self.pooler is None:
            raise RuntimeError("this model does not serve embeddings (model.task)")
        return self.pooler.take(hidden, inp.pool)

    def _hidden(
        self, inp: StepInputs, positions: torch.Tensor | None = None, mm: MmEmbeds | None = None
    ) -> torch.Tensor:  # [T, H], or [B, H] from the graph runner
        """The step's forward in the flat token layout (tensor-parallel workers run it too).
        `positions`: what RoPE sees (a vision model's: + each sequence's M-RoPE delta), `mm` a
        vision model's prefill inputs (core/vision/mm_step.py)."""
        m = inp.meta
        gr = self.graph_runner
        positions = inp.positions if positions is None else positions
        if gr is not None and m.is_decode_only and gr.takes(m.num_seqs) and mm is None:
            hidden = gr.run(
                DecodeBatch(
                    inp.input_ids,
                    positions,
                    m.slot_mapping,
                    m.seq_lens,
                    m.block_tables,
                    m.query_start,
                    m.seq_lens_cpu,
                    inp.lora_slots,
                )
            )  # [B, H], one row per sequence in batch order (T = B)
        else:
            self.model.backend.begin_step(m)
            hidden = self.model(
                inp.input_ids, positions, self.kv_caches, m, inp.lora_slots, self.model.lora, mm
            )  # [T, H]
        return hidden

    def _write_adapters(self, batch: ScheduledBatch) -> None:
        """LoRA adapters placed in slots by the scheduler, copied in before the step reads them
        (the slots were idle: no step in flight reads their old contents, on CUDA by stream order)."""
        stack = self.model.lora
        if stack is None:
            raise RuntimeError("a LoRA adapter was scheduled on a model without LoRA buffers")
        for slot, adapter in batch.lora_writes:
            stack.write(slot, adapter)

    def _multi_query_hidden(self, inp: StepInputs) -> torch.Tensor | None:
        """[T, H] of a step run in the padded [rows, Q] layout (core/spec/verify_layout.py): a
        verify-only step through the multi-query graph when one takes it, else eager over the
        graph-safe verify attention (one batched attention instead of one per row); a short prefill
        step through the graph only (eager, the flat layout serves it as well). None: the flat
        layout runs the step (no graph-safe backend, embeddings, or a row longer than Q)."""
        m = inp.meta
        if (m.is_decode_only and not inp.verify_only) or inp.pool or inp.lora_slots is not None:
            return None  # decode steps take the decode graph (_hidden): checked first, every step
        gr = self.graph_runner
        if gr is not None and not (gr.verify_queries > 0 and gr.takes_verify(m.num_seqs)):
            gr = None  # no multi-query graph for this step
        longest = max(m.query_lens_cpu)
        if inp.verify_only:
            if gr is None and not self.model.backend.graph_safe_decode:
                return None
        elif gr is None or not gr.takes_short_prefill(longest):
            return None
        q = gr.verify_queries_for(longest) if gr is not None else longest
        laid = padded_verify_batch(inp, q)
        if laid is None:
            return None
        batch, rows = laid
        if gr is not None:
            hidden = gr.run_verify(batch)  # [B * Q, H]
        else:
            meta = VerifyMetadata(batch.slot_mapping, batch.seq_lens, batch.query_lens, batch.block_tables)
            hidden = self.model(
                batch.input_ids.reshape(-1), batch.positions.reshape(-1), self.kv_caches, meta
            )
        return hidden.index_select(0, rows)  # the flat layout's tokens, in order

    def release(self, seq: Seq) -> None:
        self.sampler.release(seq.seq_id)
        self.inputs.release(seq)
        if self.pooler is not None:
            self.pooler.release(seq.seq_id)

    def poll(self) -> None:
        if self.graph_runner is not None:
            self.graph_runner.poll()

    def close(self) -> None:
        if self.graph_runner is not None:
            self.graph_runner.stop()  # a background compile ends at its next phase
        if self.masks is not None:
            self.masks.close()


def _sample_rows(hidden: torch.Tensor, inp: StepInputs) -> torch.Tensor:  # [S, H]
    """The rows that sample; in a decode-only step too: a 1-token prompt chunk that is not the
    prompt's end looks like a decode row but samples nothing."""
    if not inp.sample_seqs:
        return hidden[:0]
    if len(inp.sample_seqs) < hidden.shape[0]:
        return hidden.index_select(0, inp.sample_rows)
    return hidden
