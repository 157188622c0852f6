"""The input builder's state that outlives a step: its rows, on the host and on the device.

The builder keeps one row per running sequence across steps (its "persistent batch"):
  tables  [R, W] int32 on the device: the row's block table. Only entries the device has not seen
          are written each step (blocks appended since; a whole row after an admission);
  future  [R] int64 on the device: the token the row sampled last. A decode whose input is still
          pending (engine.overlap: sampled by the step in flight) reads it from here on the
          device, so no device->host copy stands between two launches.
Rows are handed out on a sequence's first step and taken back when it finishes (`release`) or is
preempted (`ScheduledBatch.preempted`). Ordering across steps needs no care: every write to a row
(a table entry, a sampled token) is queued on the device after the step that last used it.

Apart from input_builder.py, which gathers each step's inputs: this holds the rows, their
tables and future tokens, and hands out, grows and reclaims them. `InputBuilder` extends it, so
the per-row calls of a step reach this state with no extra layer.
"""

from __future__ import annotations

import torch
from rillet.core.runner.step_inputs import StepInputs
from rillet.core.sequence import Seq


class PersistentBatch:
    def __init__(self, block_size: int, device: torch.device, rows: int = 16, width: int = 16) -> None:
        self.block_size = block_size
        self.device = device
        self.tables = torch.zeros((rows, width), dtype=torch.int32, device=device)  # [R, W]
        self.future = torch.zeros(rows, dtype=torch.int64, device=device)  # [R]
        self._row_of: dict[int, int] = {}  # seq_id -> row
        self._free = list(range(rows - 1, -1, -1))  # pop() hands out low rows first
        self._mirror: list[list[int] | None] = [None] * rows  # the block list each row holds
        self._sent = [0] * rows  # entries of the row written on the device
        self.entries_written = 0  # table entries sent to the device so far (a counter for tests)

    @property
    def num_rows(self) -> int:
        return len(self._row_of)

    def release(self, seq: Seq) -> None:
        row = self._row_of.pop(seq.seq_id, None)
        if row is not None:
            self._mirror[row] = None
            self._free.append(row)

    def resolve_future(self, inputs: StepInputs) -> None:
        """Fills the pending decode inputs from the future buffer. Part of the step's device work:
        it must run after the previous step's `store_sampled`, as the device orders them."""
        if inputs.future_at is not None and inputs.future_rows is not None:
            inputs.input_ids.index_copy_(0, inputs.future_at, self.future.index_select(0, inputs.future_rows))

    def store_sampled(self, inputs: StepInputs, tokens: torch.Tensor) -> None:
        """tokens [S] int64 on the device, sampled by `inputs`: the next step's decodes read them."""
        if len(inputs.sample_seqs):
            self.future.index_copy_(0, inputs.sample_slots, tokens)

    # ---- internals ---------------------------------------------------------------------------
    def _row(self, seq: Seq, writes: list[tuple[int, int, int]]) -> int:
        """The sequence's row, with its table entries the device lacks appended to `writes`."""
        row = self._row_of.get(seq.seq_id)
        if row is None:
            if not self._free:
                self._grow_rows()
            row = self._free.pop()
            self._row_of[seq.seq_id] = row
        table = seq.block_table
        sent = self._sent[row]
        if self._mirror[row] is not table:  # new in this row, or re-admitted with new blocks
            self._mirror[row] = table
            # zero what a previous holder left past this table's end, as a fresh row would be
            writes.extend((row, col, 0) for col in range(len(table), sent))
            sent = 0
        if sent < len(table):
            writes.extend((row, col, table[col]) for col in range(sent, len(table)))
            self._sent[row] = len(table)
        elif sent > len(table):
            self._sent[row] = len(table)
        return row

    def _grow_rows(self) -> None:
        old = self.tables.shape[0]
        self.tables = torch.cat([self.tables, torch.zeros_like(self.tables)])
        self.future = torch.cat([self.future, torch.zeros_like(self.future)])
        self._mirror += [None] * old
        self._sent += [0] * old
        self._free.extend(range(2 * old - 1, old - 1, -1))

    def _fit(self, width: int) -> None:
        rows, have = self.tables.shape
        if width <= have:
            return
        tables = torch.zeros((rows, max(width, 2 * have)), dtype=torch.int32, device=self.device)
        tables[:, :have] = self.tables
        self.tables = tables
