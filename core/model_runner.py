"""Turns a scheduled batch into tensors, runs the model and samples: one call per engine step.

Token layout of a step (T tokens, B sequences): prefill chunks first, then decodes, each sequence's
new tokens contiguous. Sequence b feeds tokens [num_computed, num_computed + num_new) of its
prompt + output; it samples only when that chunk reaches its last token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch
from rillet.graphs.interface import DecodeBatch
from rillet.graphs.runner import GraphRunner

from .attention import AttentionMetadata
from .model import DecoderModel, KVCache
from .request import Sequence
from .sampler import Sampler, SampleResult
from .scheduler import ScheduledBatch


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [S] int64: row of T whose hidden state gives each sampled logit
    sample_seqs: list[Sequence]  # [S]


def order_batch(batch: ScheduledBatch) -> list[tuple[Sequence, int]]:
    """Prefill chunks (more than one new token) first, then decodes; stable within each group."""
    pairs = list(zip(batch.seqs, batch.num_new, strict=True))
    return [p for p in pairs if p[1] > 1] + [p for p in pairs if p[1] == 1]


def build_inputs(batch: ScheduledBatch, block_size: int, device: torch.device) -> StepInputs:
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    qstart = [0]
    seq_lens: list[int] = []
    q_lens: list[int] = []
    rows: list[int] = []
    sample_seqs: list[Sequence] = []
    pairs = order_batch(batch)
    for seq, n in pairs:
        start, end = seq.num_computed, seq.num_computed + n
        ids.extend(seq.tokens(start, end))
        pos.extend(range(start, end))
        table = seq.block_table
        slots.extend(table[p // block_size] * block_size + p % block_size for p in range(start, end))
        qstart.append(qstart[-1] + n)
        seq_lens.append(end)
        q_lens.append(n)
        if end == seq.num_tokens:
            rows.append(qstart[-1] - 1)
            sample_seqs.append(seq)
    width = max(len(s.block_table) for s, _ in pairs)
    tables = [s.block_table + [0] * (width - len(s.block_table)) for s, _ in pairs]

    def t(x: list[int] | list[list[int]], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(x, dtype=dtype).to(device, non_blocking=True)

    meta = AttentionMetadata(
        slot_mapping=t(slots, torch.int64),
        query_start=t(qstart, torch.int32),
        seq_lens=t(seq_lens, torch.int32),
        block_tables=t(tables, torch.int32),
        query_lens_cpu=q_lens,
        seq_lens_cpu=seq_lens,
        block_size=block_size,
        num_prefills=sum(1 for n in q_lens if n > 1),
    )
    return StepInputs(t(ids, torch.int64), t(pos, torch.int64), meta, t(rows, torch.int64), sample_seqs)


class Runner(Protocol):
    """What the engine needs from a model: run one scheduled step, return sampled tokens."""

    def step(self, batch: ScheduledBatch) -> tuple[list[Sequence], SampleResult]: ...

    def release(self, seq: Sequence) -> None: ...


class DecoderGraphAdapter:
    """The model as graphs/ sees it (graphs/interface.py): host planning, then a capturable forward."""

    def __init__(self, model: DecoderModel, kv_caches: list[KVCache], block_size: int) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.meta: AttentionMetadata | None = None

    def prepare_decode(self, b: DecodeBatch) -> None:
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
        assert self.meta is not None
        return self.model(b.input_ids, b.positions, self.kv_caches, self.meta)


class ModelRunner:
    """Eager forward for prefill steps; decode-only steps go through the GraphRunner when given
    (CUDA-graph replay per batch-size bucket on GPU; padded or plain eager elsewhere)."""

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

    @torch.inference_mode()
    def step(self, batch: ScheduledBatch) -> tuple[list[Sequence], SampleResult]:
        inp = build_inputs(batch, self.block_size, self.device)
        m = inp.meta
        if self.graph_runner is not None and m.is_decode_only:
            hidden = self.graph_runner.run(
                DecodeBatch(
                    inp.input_ids,
                    inp.positions,
                    m.slot_mapping,
                    m.seq_lens,
                    m.block_tables,
                    m.query_start,
                    m.seq_lens_cpu,
                )
            )  # [B, H]: every decode row samples, in batch order
        else:
            self.model.backend.begin_step(m)
            hidden = self.model(inp.input_ids, inp.positions, self.kv_caches, m)  # [T, H]
            if not inp.sample_seqs:
                return [], SampleResult([], [])
            hidden = hidden.index_select(0, inp.sample_rows)
        logits = self.model.compute_logits(hidden)  # [S, V]
        return inp.sample_seqs, self.sampler.sample(logits, inp.sample_seqs)

    def release(self, seq: Sequence) -> None:
        self.sampler.release(seq.seq_id)


class SyntheticRunner:
    """The null engine: deterministic tokens, a fixed step time, no compute.

    The next token depends only on the sequence's prompt and position, so outputs are the same
    batched or alone, streamed or not. Tokens come from `token_pool` (ordinary text tokens).
    """

    def __init__(self, step_ms: float, token_pool: list[int]) -> None:
        self.step_s = step_ms / 1000.0
        self.pool = token_pool

    def step(self, batch: ScheduledBatch) -> tuple[list[Sequence], SampleResult]:
        if self.step_s > 0:
            time.sleep(self.step_s)  # like a GPU wait: releases the GIL
        seqs = [
            s for s, n in zip(batch.seqs, batch.num_new, strict=True) if s.num_computed + n == s.num_tokens
        ]
        pool = self.pool
        ids = [pool[(s.num_tokens * 7919 + s.prompt_ids[0] + s.index * 104729) % len(pool)] for s in seqs]
        return seqs, SampleResult(ids, [None] * len(ids))

    def release(self, seq: Sequence) -> None:
        pass
