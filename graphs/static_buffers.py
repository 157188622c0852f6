"""The fixed input tensors a captured decode graph reads, allocated once for the largest bucket.

A CUDA graph replays its kernels on the addresses it was captured with, so every step copies its
inputs into these same tensors (rows [0, b)) and writes the padding values into rows [b, n) of the
bucket n it replays. Nothing here allocates after `allocate`: a view of the first n rows is
handed to the model, the same storage every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .interface import PAD_BLOCK, PAD_POSITION, PAD_SEQ_LEN, PAD_SLOT, PAD_TOKEN_ID, DecodeBatch


@dataclass
class StaticBuffers:
    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    slot_mapping: torch.Tensor  # [N] int64
    seq_lens: torch.Tensor  # [N] int32
    block_tables: torch.Tensor  # [N, W] int32
    query_start: torch.Tensor  # [N + 1] int32: 0..N, constant (one query token per row)

    @classmethod
    def allocate(cls, max_rows: int, max_blocks_per_seq: int, device: torch.device) -> StaticBuffers:
        if max_rows < 1 or max_blocks_per_seq < 1:
            raise ValueError(
                f"need max_rows >= 1 and max_blocks_per_seq >= 1, got {max_rows}, {max_blocks_per_seq}"
            )

        def full(shape: tuple[int, ...], value: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.full(shape, value, dtype=dtype, device=device)

        return cls(
            input_ids=full((max_rows,), PAD_TOKEN_ID, torch.int64),
            positions=full((max_rows,), PAD_POSITION, torch.int64),
            slot_mapping=full((max_rows,), PAD_SLOT, torch.int64),
            seq_lens=full((max_rows,), PAD_SEQ_LEN, torch.int32),
            block_tables=full((max_rows, max_blocks_per_seq), PAD_BLOCK, torch.int32),
            query_start=torch.arange(max_rows + 1, dtype=torch.int32, device=device),
        )

    @property
    def max_rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def max_blocks_per_seq(self) -> int:
        return self.block_tables.shape[1]

    def fill(self, batch: DecodeBatch, rows: int) -> DecodeBatch:
        """Copies batch's b rows into rows [0, b), padding into [b, rows); returns the rows view."""
        b, w = batch.num_rows, batch.block_tables.shape[1]
        if not 1 <= b <= rows <= self.max_rows:
            raise ValueError(f"cannot place {b} rows in a bucket of {rows} (buffers hold {self.max_rows})")
        if w > self.max_blocks_per_seq:
            raise ValueError(f"block table width {w} exceeds the static width {self.max_blocks_per_seq}")
        # non_blocking: a host batch is copied in stream order, a device batch is a device copy
        self.input_ids[:b].copy_(batch.input_ids, non_blocking=True)
        self.positions[:b].copy_(batch.positions, non_blocking=True)
        self.slot_mapping[:b].copy_(batch.slot_mapping, non_blocking=True)
        self.seq_lens[:b].copy_(batch.seq_lens, non_blocking=True)
        self.block_tables[:b, :w].copy_(batch.block_tables, non_blocking=True)
        if w < self.max_blocks_per_seq:
            self.block_tables[:b, w:].fill_(PAD_BLOCK)  # stale entries of an earlier, wider step
        if b < rows:
            self._pad(b, rows)
        return self.view(rows, list(batch.seq_lens_cpu) + [PAD_SEQ_LEN] * (rows - b))

    def padding(self, rows: int) -> DecodeBatch:
        """Rows [0, rows) all padding: the inputs a graph is captured with."""
        if not 1 <= rows <= self.max_rows:
            raise ValueError(f"rows must be in 1..{self.max_rows}, got {rows}")
        self._pad(0, rows)
        return self.view(rows, [PAD_SEQ_LEN] * rows)

    def view(self, rows: int, seq_lens_cpu: list[int]) -> DecodeBatch:
        return DecodeBatch(
            input_ids=self.input_ids[:rows],
            positions=self.positions[:rows],
            slot_mapping=self.slot_mapping[:rows],
            seq_lens=self.seq_lens[:rows],
            block_tables=self.block_tables[:rows],
            query_start=self.query_start[: rows + 1],
            seq_lens_cpu=seq_lens_cpu,
        )

    def _pad(self, start: int, stop: int) -> None:
        self.input_ids[start:stop].fill_(PAD_TOKEN_ID)
        self.positions[start:stop].fill_(PAD_POSITION)
        self.slot_mapping[start:stop].fill_(PAD_SLOT)
        self.seq_lens[start:stop].fill_(PAD_SEQ_LEN)
        self.block_tables[start:stop].fill_(PAD_BLOCK)
