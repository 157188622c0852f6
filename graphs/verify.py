"""The speculative verify step as a graph: static buffers, and its compiled CPU function.

A verify step feeds Q query tokens per row (graphs/interface.py VerifyBatch): each row's last token
and its draft, padded to the step's longest row. On CPU the forward is compiled like the decode
step: the row count, Q and the block-table width are dynamic (symbolic) dimensions, so one graph
serves every step of 2 rows and more whatever its drafts' lengths, and a second graph (compiled
after it) serves a single row, which dynamo always specialises. Before that second graph is ready,
a single row runs as 2 rows (the second a padding row). Padding a batch-1 step to 2 rows and every
row to 1 + speculative.num_tokens queries cost a verify step about twice a plain decode step on
the default model (10 query rows instead of 1 + k), which ate most of what accepted drafts gain.
On CUDA graphs/cuda_capture.py captures it per batch-size bucket up to speculative.max_batch, with Q
fixed at 1 + speculative.num_tokens (a captured graph has one shape).
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
    DecodeBatch,
    VerifyBatch,
    VerifyModel,
)

logger = logging.getLogger(__name__)

COMPILE_ROWS, COMPILE_WIDTH = 2, 3  # as the decode step's (graphs/compile_modes.py)
# Q of the compile's example batch: distinct from the rows and the width, so that dynamo keeps
# three symbols (equal example sizes would share one and specialise on their equality)
COMPILE_QUERIES = 5
MIN_QUERIES = 2  # a verify row holds its last token and at least one draft token


@dataclass
class VerifyBuffers:
    input_ids: torch.Tensor  # [N * Q] int64, viewed [n, q] for any q <= Q
    positions: torch.Tensor  # [N * Q] int64
    slot_mapping: torch.Tensor  # [N * Q] int64
    seq_lens: torch.Tensor  # [N] int32
    query_lens: torch.Tensor  # [N] int32
    block_tables: torch.Tensor  # [N * W] int32, viewed [n, width]
    num_queries: int  # Q: the most queries a row may have
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
        """Copies batch's b rows into rows [0, b), padding rows into [b, rows); returns the view
        (rows x the batch's own Q)."""
        b, w, q = batch.num_rows, batch.block_tables.shape[1], batch.num_queries
        width = self.max_blocks_per_seq if width is None else width
        if (
            q > self.num_queries
            or not 1 <= b <= rows <= self.max_rows
            or not w <= width <= self.max_blocks_per_seq
        ):
            raise ValueError(
                f"cannot place a {b}x{q} verify batch in {rows}x{self.num_queries} (width {width})"
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
            self._pad(b, rows, width, q)
        pad = rows - b
        return self.view(
            rows, q, [*batch.seq_lens_cpu, *[PAD_SEQ_LEN] * pad], [*batch.query_lens_cpu, *[1] * pad], width
        )

    def padding(self, rows: int, width: int | None = None, queries: int | None = None) -> VerifyBatch:
        width = self.max_blocks_per_seq if width is None else width
        q = self.num_queries if queries is None else queries
        self._pad(0, rows, width, q)
        return self.view(rows, q, [PAD_SEQ_LEN] * rows, [1] * rows, width)

    def view(
        self, rows: int, q: int, seq_lens_cpu: list[int], query_lens_cpu: list[int], width: int
    ) -> VerifyBatch:
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

    def _pad(self, start: int, stop: int, width: int, q: int) -> None:
        self.input_ids[start * q : stop * q].fill_(PAD_TOKEN_ID)
        self.positions[start * q : stop * q].fill_(PAD_POSITION)
        self.slot_mapping[start * q : stop * q].fill_(PAD_SLOT)
        self.seq_lens[start:stop].fill_(PAD_SEQ_LEN)
        self.query_lens[start:stop].fill_(1)
        self.block_tables[start * width : stop * width].fill_(PAD_BLOCK)


def as_decode_rows(batch: VerifyBatch) -> DecodeBatch:
    """The verify batch as n * Q decode rows, query by query: query i of a row becomes a decode row
    at its position, over the row's block table, with the context up to and including itself.
    Same outputs, in the same order: a decode step writes every row's K/V before any row attends
    (core/attention/torch_backend.py), so a query sees the drafts before it as a verify step's
    causal mask lets it. Padding queries stay padding (PAD_POSITION, PAD_SLOT: a context of 1)."""
    q = batch.num_queries
    n = batch.num_rows * q
    positions = batch.positions.reshape(n)
    seq_lens_cpu: list[int] = []
    for seq_len, real in zip(batch.seq_lens_cpu, batch.query_lens_cpu, strict=True):
        seq_lens_cpu += [seq_len - real + i + 1 for i in range(real)] + [PAD_POSITION + 1] * (q - real)
    return DecodeBatch(
        input_ids=batch.input_ids.reshape(n),
        positions=positions,
        slot_mapping=batch.slot_mapping.reshape(n),
        seq_lens=(positions + 1).to(torch.int32),
        block_tables=batch.block_tables.repeat_interleave(q, dim=0),
        query_start=torch.arange(n + 1, dtype=torch.int32, device=positions.device),
        seq_lens_cpu=seq_lens_cpu,
    )


def mark_verify_dynamic(
    batch: VerifyBatch, strict: bool = True, rows: bool = True, queries: bool = False
) -> None:
    """The block-table width, the row count (unless `rows` is False: the batch-1 graph) and Q (if
    `queries`: the compiled CPU step) as symbols. Not `strict`: a model that specialises one
    recompiles instead of failing (CUDA capture, as the decode step's)."""
    mark = torch._dynamo.mark_dynamic if strict else torch._dynamo.maybe_mark_dynamic
    mark(batch.block_tables, 1)
    per_query = (batch.input_ids, batch.positions, batch.slot_mapping)
    if queries:
        for t in per_query:
            mark(t, 1)
    if rows:
        for t in (*per_query, batch.seq_lens, batch.query_lens, batch.block_tables):
            mark(t, 0)


class CompiledVerify:
    """The compiled verify functions of one model (CPU): `compile()` runs on the decode step's
    compile thread after the decode graphs (graphs/compiled.py): the graph of 2 rows and more
    first (`ready`), then the single-row one (`ready_1`)."""

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
        self.num_queries = num_queries  # the most queries a row has (1 + speculative.num_tokens)
        width = max(max_blocks_per_seq, COMPILE_WIDTH)
        self._warm = VerifyBuffers.allocate(COMPILE_ROWS, max(num_queries, COMPILE_QUERIES), width, device)
        self.ready = False
        self.ready_1 = False
        self.failed: str | None = None
        self.seconds = 0.0

    def example(self, rows: int = COMPILE_ROWS) -> VerifyBatch:
        """The padding batch a compile (or a saved step's export and check) runs on."""
        return self._warm.padding(rows, COMPILE_WIDTH, COMPILE_QUERIES)

    def use(self, fn: Callable[[VerifyBatch], torch.Tensor]) -> None:
        """A saved step (graphs/aot/) instead of compiling: its rows start at 1 and its Q is
        dynamic, so it serves a single row too."""
        self.fn = fn
        self.ready = True
        self.ready_1 = True

    def compile(self, stopping: Callable[[], bool] = lambda: False) -> None:
        start = time.perf_counter()
        self._run_example(COMPILE_ROWS)
        self.ready = True
        self.seconds = time.perf_counter() - start
        logger.info("verify step compiled in %.1f s (2 rows and more, any draft length)", self.seconds)
        if stopping():
            return
        self._run_example(1)
        self.ready_1 = True
        logger.info("verify step for 1 row compiled in %.1f s", time.perf_counter() - start - self.seconds)
        self.seconds = time.perf_counter() - start

    def _run_example(self, rows: int) -> None:
        batch = self.example(rows)
        mark_verify_dynamic(batch, rows=rows > 1, queries=True)
        self.model.prepare_verify(batch)
        self.fn(batch)

    def __call__(self, batch: VerifyBatch) -> torch.Tensor:
        return self.fn(batch)

    def rows_for(self, b: int) -> int:
        """Dynamo specialises a dimension of 1: a single row runs as 2 (the second padding) until
        its own graph is ready."""
        return 1 if b == 1 and self.ready_1 else max(b, COMPILE_ROWS)

    @staticmethod
    def queries_for(q: int) -> int:
        """Q of a step whose longest row holds q tokens (never 1: a single query is a decode)."""
        return max(q, MIN_QUERIES)
