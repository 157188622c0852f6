"""The fixed input tensors a decode graph reads, allocated once for the largest bucket.

A CUDA graph replays its kernels on the addresses it was captured with, so every step copies its
inputs into these same tensors (rows [0, b)) and writes the padding values into rows [b, n) of the
bucket n it replays. Nothing here allocates after `allocate`: a view of the first n rows is
handed to the model, the same storage every step.

The block table is one flat buffer viewed as [n, width], contiguous for any width: a CUDA graph
reads the full width it was captured with; the compiled CPU step reads only as many columns as
the step's longest context needs (its width is a dynamic dimension there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rillet.graphs.interface import (
    PAD_BLOCK,
    PAD_LORA_SLOT,
    PAD_POSITION,
    PAD_SEQ_LEN,
    PAD_SLOT,
    PAD_TOKEN_ID,
    DecodeBatch,
)


@dataclass
class StaticBuffers:
    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    slot_mapping: torch.Tensor  # [N] int64
    seq_lens: torch.Tensor  # [N] int32
    block_tables: torch.Tensor  # [N * W] int32, viewed as [n, width] (width <= W)
    query_start: torch.Tensor  # [N + 1] int32: 0..N, constant (one query token per row)
    max_blocks_per_seq: int  # W
    lora_slots: torch.Tensor  # [N] int64: each row's adapter slot (0: none)

    @classmethod
    def allocate(cls, max_rows: int, max_blocks_per_seq: int, device: torch.device) -> StaticBuffers:
        if max_rows < 1 or max_blocks_per_seq < 1:
            raise ValueError(
                f"need max_rows >= 1 and max_blocks_per_seq >= 1, got {max_rows}, {max_blocks_per_seq}"
            )

        def full(shape: tuple[int, ...], value: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.full(shape, value, dtype=dtype, device=device)

        buffers = cls(
            input_ids=full((max_rows,), PAD_TOKEN_ID, torch.int64),
            positions=full((max_rows,), PAD_POSITION, torch.int64),
            slot_mapping=full((max_rows,), PAD_SLOT, torch.int64),
            seq_lens=full((max_rows,), PAD_SEQ_LEN, torch.int32),
            block_tables=full((max_rows * max_blocks_per_seq,), PAD_BLOCK, torch.int32),
            query_start=torch.arange(max_rows + 1, dtype=torch.int32, device=device),
            max_blocks_per_seq=max_blocks_per_seq,
            lora_slots=full((max_rows,), PAD_LORA_SLOT, torch.int64),
        )
        return buffers

    @property
    def max_rows(self) -> int:
        return self.input_ids.shape[0]

    def fill(self, batch: DecodeBatch, rows: int, width: int | None = None) -> DecodeBatch:
        """Copies batch's b rows into rows [0, b), padding into [b, rows); returns the rows view.

        `width`: block-table columns of the view (None = all W); at least the batch's own width.
        """
        b, w = batch.num_rows, batch.block_tables.shape[1]
        width = self.max_blocks_per_seq if width is None else width
        if not 1 <= b <= rows <= self.max_rows:
            raise ValueError(f"cannot place {b} rows in a bucket of {rows} (buffers hold {self.max_rows})")
        if not w <= width <= self.max_blocks_per_seq:
            raise ValueError(
                f"block table width {w} does not fit a view {width} wide "
                f"(static width {self.max_blocks_per_seq})"
            )
        # non_blocking: a host batch is copied in stream order, a device batch is a device copy
        self.input_ids[:b].copy_(batch.input_ids, non_blocking=True)
        self.positions[:b].copy_(batch.positions, non_blocking=True)
        self.slot_mapping[:b].copy_(batch.slot_mapping, non_blocking=True)
        self.seq_lens[:b].copy_(batch.seq_lens, non_blocking=True)
        if batch.lora_slots is not None:
            self.lora_slots[:b].copy_(batch.lora_slots, non_blocking=True)
        else:
            self.lora_slots[:b].fill_(PAD_LORA_SLOT)
        tables = self.block_tables[: rows * width].view(rows, width)
        if w == width:
            tables[:b].copy_(batch.block_tables, non_blocking=True)
        else:
            tables[:b, :w].copy_(batch.block_tables, non_blocking=True)
            tables[:b, w:].fill_(PAD_BLOCK)  # unused columns: the dummy block, masked by length
        if b < rows:
            self._pad(b, rows, width)
        return self.view(rows, list(batch.seq_lens_cpu) + [PAD_SEQ_LEN] * (rows - b), width)

    def padding(self, rows: int, width: int | None = None) -> DecodeBatch:
        """Rows [0, rows) all padding: the inputs a graph is captured (or compiled) with."""
        width = self.max_blocks_per_seq if width is None else width
        if not 1 <= rows <= self.max_rows or not 1 <= width <= self.max_blocks_per_seq:
            raise ValueError(f"rows must be in 1..{self.max_rows} and width in 1..{self.max_blocks_per_seq}")
        self._pad(0, rows, width)
        return self.view(rows, [PAD_SEQ_LEN] * rows, width)

    def view(self, rows: int, seq_lens_cpu: list[int], width: int | None = None) -> DecodeBatch:
        width = self.max_blocks_per_seq if width is None else width
        return DecodeBatch(
            input_ids=self.input_ids[:rows],
            positions=self.positions[:rows],
            slot_mapping=self.slot_mapping[:rows],
            seq_lens=self.seq_lens[:rows],
            block_tables=self.block_tables[: rows * width].view(rows, width),
            query_start=self.query_start[: rows + 1],
            seq_lens_cpu=seq_lens_cpu,
            lora_slots=self.lora_slots[:rows],
        )

    def _pad(self, start: int, stop: int, width: int) -> None:
        self.input_ids[start:stop].fill_(PAD_TOKEN_ID)
        self.positions[start:stop].fill_(PAD_POSITION)
        self.slot_mapping[start:stop].fill_(PAD_SLOT)
        self.seq_lens[start:stop].fill_(PAD_SEQ_LEN)
        self.lora_slots[start:stop].fill_(PAD_LORA_SLOT)
        self.block_tables[start * width : stop * width].fill_(PAD_BLOCK)
