"""The speculative verify step as a graph: static buffers, and its compiled CPU function.

A verify step feeds Q = 1 + k query tokens per row (graphs/interface.py VerifyBatch); Q is fixed
per engine (speculative.num_tokens), so a row with a shorter draft is padded to Q, and the step
keeps one shape per row count. On CPU the forward is compiled like the decode step (the row count
and the block-table width dynamic: one graph for every batch of 2 rows and more; a batch of 1
runs as 2 rows, the second a padding row), after the decode graphs, on the same background
thread. On CUDA graphs/runner.py captures it per batch-size bucket up to speculative.max_batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from rillet.graphs.interface import (
    PAD_BLOCK,
    PAD_POSITION,
    PAD_SEQ_LEN,
    PAD_SLOT,
    PAD_TOKEN_ID,
    VerifyBatch,
    VerifyModel,
)

logger = logging.getLogger(__name__)

COMPILE_ROWS, COMPILE_WIDTH = 2, 3  # as the decode step's (graphs/compiled.py)


@dataclass
class VerifyBuffers:
    input_ids: torch.Tensor  # [N * Q] int64, viewed [n, Q]
    positions: torch.Tensor  # [N * Q] int64
    slot_mapping: torch.Tensor  # [N * Q] int64
    seq_lens: torch.Tensor  # [N] int32
    query_lens: torch.Tensor  # [N] int32
    block_tables: torch.Tensor  # [N * W] int32, viewed [n, width]
    num_queries: int  # Q
    max_blocks_per_seq: int  # W

    @classmethod
    def allocate(
        cls, max_rows: int, num_queries: int, max_blocks_per_seq: int, device: torch.device
    ) -> VerifyBuffers:
        def full(n: int, value: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.full((n,), value, dtype=dtype, device=device)

        tokens = max_rows * num_queries
        return cls(
            input_ids=full(tokens, PAD_TOKEN_ID, torch.int64),
            positions=full(tokens, PAD_POSITION, torch.int64),
            slot_mapping=full(tokens, PAD_SLOT, torch.int64),
            seq_lens=full(max_rows, PAD_SEQ_LEN, torch.int32),
            query_lens=full(max_rows, 1, torch.int32),
            block_tables=full(max_rows * max_blocks_per_seq, PAD_BLOCK, torch.int32),
            num_queries=num_queries,
            max_blocks_per_seq=max_blocks_per_seq,
        )

    @property
    def max_rows(self) -> int:
        return self.seq_lens.shape[0]

    def fill(self, batch: VerifyBatch, rows: int, width: int | None = None) -> VerifyBatch:
        """Copies batch's b rows into rows [0, b), padding rows into [b, rows); returns the view."""
        b, w, q = batch.num_rows, batch.block_tables.shape[1], self.num_queries
        width = self.max_blocks_per_seq if width is None else width
        if (
            batch.num_queries != q
            or not 1 <= b <= rows <= self.max_rows
            or not w <= width <= self.max_blocks_per_seq
        ):
            raise ValueError(
                f"cannot place a {b}x{batch.num_queries} verify batch in {rows}x{q} (width {width})"
            )
        self.input_ids[: b * q].copy_(batch.input_ids.reshape(-1), non_blocking=True)
        self.positions[: b * q].copy_(batch.positions.reshape(-1), non_blocking=True)
        self.slot_mapping[: b * q].copy_(batch.slot_mapping.reshape(-1), non_blocking=True)
        self.seq_lens[:b].copy_(batch.seq_lens, non_blocking=True)
        self.query_lens[:b].copy_(batch.query_lens, non_blocking=True)
        tables = self.block_tables[: rows * width].view(rows, width)
        tables[:b, :w].copy_(batch.block_tables, non_blocking=True)
        tables[:b, w:].fill_(PAD_BLOCK)
        if b < rows:
            self._pad(b, rows, width)
        pad = rows - b
        return self.view(
            rows, [*batch.seq_lens_cpu, *[PAD_SEQ_LEN] * pad], [*batch.query_lens_cpu, *[1] * pad], width
        )

    def padding(self, rows: int, width: int | None = None) -> VerifyBatch:
        width = self.max_blocks_per_seq if width is None else width
        self._pad(0, rows, width)
        return self.view(rows, [PAD_SEQ_LEN] * rows, [1] * rows, width)

    def view(self, rows: int, seq_lens_cpu: list[int], query_lens_cpu: list[int], width: int) -> VerifyBatch:
        q = self.num_queries
        return VerifyBatch(
            input_ids=self.input_ids[: rows * q].view(rows, q),
            positions=self.positions[: rows * q].view(rows, q),
            slot_mapping=self.slot_mapping[: rows * q].view(rows, q),
            seq_lens=self.seq_lens[:rows],
            query_lens=self.query_lens[:rows],
            block_tables=self.block_tables[: rows * width].view(rows, width),
            seq_lens_cpu=seq_lens_cpu,
            query_lens_cpu=query_lens_cpu,
        )

    def _pad(self, start: int, stop: int, width: int) -> None:
        q = self.num_queries
        self.input_ids[start * q : stop * q].fill_(PAD_TOKEN_ID)
        self.positions[start * q : stop * q].fill_(PAD_POSITION)
        self.slot_mapping[start * q : stop * q].fill_(PAD_SLOT)
        self.seq_lens[start:stop].fill_(PAD_SEQ_LEN)
        self.query_lens[start:stop].fill_(1)
        self.block_tables[start * width : stop * width].fill_(PAD_BLOCK)


def mark_verify_dynamic(batch: VerifyBatch, strict: bool = True) -> None:
    """The row count and the block-table width as symbols (Q stays a constant). Not `strict`: a
    model that specialises one recompiles instead of failing (CUDA capture, as the decode step's)."""
    mark = torch._dynamo.mark_dynamic if strict else torch._dynamo.maybe_mark_dynamic
    mark(batch.block_tables, 1)
    for t in (
        batch.input_ids,
        batch.positions,
        batch.slot_mapping,
        batch.seq_lens,
        batch.query_lens,
        batch.block_tables,
    ):
        mark(t, 0)


class CompiledVerify:
    """The compiled verify function of one model (CPU); `compile()` runs on the decode step's
    compile thread after the decode graphs (graphs/compiled.py)."""

    def __init__(
        self,
        model: VerifyModel,
        fn: Callable[[VerifyBatch], torch.Tensor],  # compile_decode(model.forward_verify, mode)
        num_queries: int,
        max_blocks_per_seq: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.fn = fn
        self.num_queries = num_queries
        width = max(max_blocks_per_seq, COMPILE_WIDTH)
        self._warm = VerifyBuffers.allocate(COMPILE_ROWS, num_queries, width, device)
        self.ready = False
        self.failed: str | None = None
        self.seconds = 0.0

    def example(self) -> VerifyBatch:
        """The padding batch a compile (or a saved step's check) runs on."""
        return self._warm.padding(COMPILE_ROWS, COMPILE_WIDTH)

    def use(self, fn: Callable[[VerifyBatch], torch.Tensor]) -> None:
        """A saved step (graphs/aot/) instead of compiling."""
        self.fn = fn
        self.ready = True

    def compile(self) -> None:
        start = time.perf_counter()
        batch = self.example()
        mark_verify_dynamic(batch)
        self.model.prepare_verify(batch)
        self.fn(batch)
        self.seconds = time.perf_counter() - start
        self.ready = True
        logger.info("verify step (%d queries a row) compiled in %.1f s", self.num_queries, self.seconds)

    def __call__(self, batch: VerifyBatch) -> torch.Tensor:
        return self.fn(batch)

    @staticmethod
    def rows_for(b: int) -> int:
        """Dynamo specialises a dimension of 1: a single row runs as 2 (the second padding)."""
        return max(b, COMPILE_ROWS)
