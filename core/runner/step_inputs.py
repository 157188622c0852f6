"""A step's model inputs, built from persistent device state: host work per step grows with the new
tokens and the changed block-table entries, not with the blocks the batch holds.

The builder keeps one row per running sequence across steps (its "persistent batch"):
  tables  [R, W] int32 on the device: the row's block table. Only entries the device has not seen
          are written each step (blocks appended since; a whole row after an admission);
  future  [R] int64 on the device: the token the row sampled last. A decode whose input is still
          pending (engine.overlap: sampled by the step in flight) reads it from here on the
          device, so no device->host copy stands between two launches.
Rows are handed out on a sequence's first step and taken back when it finishes (`release`) or is
preempted (`ScheduledBatch.preempted`). Ordering across steps needs no care: every write to a row
(a table entry, a sampled token) is queued on the device after the step that last used it.

Per step the host sends one int64 tensor: the known token ids, per sequence (row, first position,
query start), the sampling rows, the future reads and the table writes. Positions, slot mapping,
context lengths and the step's block-table view are derived from it on the device.

Token layout of a step (T tokens, B sequences): rows that do not end in a sampled single-token
decode (prefill chunks) first, then the decodes, each sequence's new tokens contiguous. Seq b
feeds tokens [num_computed, num_computed + num_new) of its prompt + output (+ pending token); it
samples only when that chunk reaches the end.

Speculative decoding: a verify row (a sequence with a draft, core/spec/) feeds its last token and
its k draft tokens, and samples at each of those 1 + k tokens: its sample rows are consecutive,
`sample_seqs` names the sequence once per row and `sample_offsets` gives each row's position in
the run (0..k; None when the step verifies nothing). A verify row is laid out as a prefill chunk
(its queries attend causally to each other over the paged cache).

LoRA: each sequence's slot in the adapters' stacked buffers (core/lora/stack.py; 0 = the base
model) travels per token as `lora_slots`, only when some row of the step has an adapter.
"""

from __future__ import annotations

import array
from dataclasses import dataclass, field

import torch
from rillet.core.attention.base import AttentionMetadata
from rillet.core.engine.scheduler import ScheduledBatch
from rillet.core.sequence import Seq


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [S] int64: row of T whose hidden state gives each sampled logit
    sample_seqs: list[Seq]  # [S]
    sample_slots: torch.Tensor  # [S] int64: persistent row of each sampled sequence
    future_at: torch.Tensor | None = None  # [F] int64: input_ids entries the future buffer feeds
    future_rows: torch.Tensor | None = None  # [F] int64: ... from these rows
    pool: list[PoolRows] = field(default_factory=list)  # embedding chunks: pooled, never sampled
    sample_offsets: list[int] | None = None  # [S] position of each sample row in its verify run
    verify_only: bool = False  # verify rows and decodes only: every token samples (graph verify step)
    lora_slots: torch.Tensor | None = None  # [T] int64 LoRA slot per token; None: every row is base


@dataclass(slots=True)
class PoolRows:
    """One embedding sequence's chunk in a step: tokens [first, first + count) of the step's T."""

    seq: Seq
    first: int
    count: int
    start: int  # the position of the chunk's first token (0: the chunk opens the sequence)
    last: bool  # the chunk ends the prompt: the vector is ready after this step


def order_batch(batch: ScheduledBatch) -> list[tuple[Seq, int]]:
    """Prefill chunks first, then decodes (one new token that is sampled); stable in each group."""
    chunks, decodes = split_batch(batch)
    return chunks + [(seq, 1) for seq in decodes]


def split_batch(batch: ScheduledBatch) -> tuple[list[tuple[Seq, int]], list[Seq]]:
    """(prefill chunks with their new-token counts, decodes), each in batch order."""
    chunks: list[tuple[Seq, int]] = []
    decodes: list[Seq] = []
    for seq, n in zip(batch.seqs, batch.num_new, strict=True):
        # a decode: one new token, which reaches the end (prompt + outputs + the pending one);
        # a one-token embedding prompt is a chunk: it is pooled, not sampled
        n_all = len(seq.prompt_ids) + len(seq.output_ids) + seq.num_pending
        if n == 1 and seq.num_computed + 1 == n_all and seq.embed is None:
            decodes.append(seq)
        else:
            chunks.append((seq, n))
    return chunks, decodes


class InputBuilder:
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

    def build(self, batch: ScheduledBatch) -> StepInputs:
        for seq in batch.preempted:
            self.release(seq)
        chunks, decodes = split_batch(batch)
        h = _HostLists()
        verifies = 0
        for seq, n in chunks:
            if seq.draft_ids:
                self._add_verify(h, seq, n)
                verifies += 1
            else:
                self._add_chunk(h, seq, n)
        self._add_decodes(h, decodes)
        self._fit(max(w[1] for w in h.writes) + 1 if h.writes else 0)
        inputs = self._to_device(h, num_chunks=len(chunks))
        if verifies:
            inputs.sample_offsets = h.offsets + [0] * (len(h.sample_at) - len(h.offsets))
            inputs.verify_only = verifies == len(chunks)
        return inputs

    def _add_verify(self, h: _HostLists, seq: Seq, n: int) -> None:
        """A sequence's last token and its draft (n = 1 + k tokens), sampled at each of them."""
        k = len(seq.draft_ids)
        start = seq.num_computed
        assert n == k + 1 and start + 1 == seq.num_tokens and not seq.num_pending, "not a verify row"
        row = self._row(seq, h.writes)
        h.offsets += [0] * (len(h.sample_at) - len(h.offsets))  # rows sampled before: offset 0
        first = len(h.ids)
        h.ids.append(seq.token_at(start))
        h.ids += seq.draft_ids
        h.rows.append(row)
        h.slots.append(seq.lora_slot)
        h.starts.append(start)
        h.qstart.append(h.qstart[-1] + n)
        h.lens.append(start + n)
        h.sample_at += range(first, first + n)
        h.sample_row += [row] * n
        h.sample_seqs += [seq] * n
        h.offsets += range(n)

    def _add_chunk(self, h: _HostLists, seq: Seq, n: int) -> None:
        row = self._row(seq, h.writes)
        start, known = seq.num_computed, seq.num_tokens
        end = start + n
        if end <= known:
            h.ids += seq.tokens(start, end)
        else:  # the last token fed is the pending one: its id is on the device only
            h.ids += seq.tokens(start, known)
            h.fut_at.append(len(h.ids))
            h.fut_row.append(row)
            h.ids.append(0)
        h.rows.append(row)
        h.slots.append(seq.lora_slot)
        h.starts.append(start)
        h.qstart.append(h.qstart[-1] + n)
        h.lens.append(end)
        if seq.embed is not None:
            h.pool.append(PoolRows(seq, h.qstart[-2], n, start, end == seq.num_scheduled_tokens))
        elif end == seq.num_scheduled_tokens:
            h.sample_at.append(h.qstart[-1] - 1)
            h.sample_row.append(row)
            h.sample_seqs.append(seq)

    def _add_decodes(self, h: _HostLists, decodes: list[Seq]) -> None:
        """The common case, once per decoding sequence per step: kept to a few list operations."""
        row_of, mirror, sent = self._row_of, self._mirror, self._sent
        ids, rows, starts, lens, fut_at, fut_row = h.ids, h.rows, h.starts, h.lens, h.fut_at, h.fut_row
        slots = h.slots
        first_row, first_tok = len(rows), len(ids)
        for seq in decodes:
            row = row_of.get(seq.seq_id, -1)
            table = seq.block_table
            if row < 0 or mirror[row] is not table or sent[row] != len(table):
                row = self._row(seq, h.writes)
            start = seq.num_computed
            prompt = seq.prompt_ids
            if start < len(prompt):
                ids.append(prompt[start])
            elif start < len(prompt) + len(seq.output_ids):
                ids.append(seq.output_ids[start - len(prompt)])
            else:  # pending: the device has it
                fut_at.append(len(ids))
                fut_row.append(row)
                ids.append(0)
            rows.append(row)
            slots.append(seq.lora_slot)
            starts.append(start)
            lens.append(start + 1)
        q0 = h.qstart[-1]
        h.qstart += range(q0 + 1, q0 + 1 + len(decodes))
        h.sample_at += range(first_tok, first_tok + len(decodes))
        h.sample_row += rows[first_row:]
        h.sample_seqs += decodes

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

    def _to_device(self, h: _HostLists, num_chunks: int) -> StepInputs:
        n_tok, n_seq, n_smp, n_fut, n_wr = (
            len(h.ids),
            len(h.rows),
            len(h.sample_at),
            len(h.fut_at),
            len(h.writes),
        )
        stride, bs = self.tables.shape[1], self.block_size
        flat_at = [r * stride + c for r, c, _ in h.writes]
        blocks = [b for _, _, b in h.writes]
        slots = h.slots if any(h.slots) else []  # all base: nothing to send
        host = (
            h.ids + h.rows + h.starts + h.qstart + h.sample_at + h.sample_row + h.fut_at + h.fut_row + slots
        )
        # array -> tensor without a copy: ~4x cheaper than torch.tensor(list) (measured, 1.5k ints)
        data = torch.frombuffer(array.array("q", host + flat_at + blocks), dtype=torch.int64)
        if self.device.type == "cuda":
            data = data.pin_memory()
        sizes = [n_tok, n_seq, n_seq, n_seq + 1, n_smp, n_smp, n_fut, n_fut, len(slots), n_wr, n_wr]
        (
            ids,
            rows,
            starts,
            qstart,
            sample_at,
            sample_row,
            fut_at,
            fut_row,
            seq_slots,
            flat_at_d,
            blocks_d,
        ) = torch.split(data.to(self.device, non_blocking=True), sizes)
        if n_wr:
            self.tables.view(-1).index_copy_(0, flat_at_d, blocks_d.to(torch.int32))
            self.entries_written += n_wr
        qlens = qstart[1:] - qstart[:-1]  # [B]
        if n_tok == n_seq:  # one token per sequence: it sits where the sequence starts
            positions, tok_rows = starts, rows
        else:
            tok_rows = torch.repeat_interleave(rows, qlens, output_size=n_tok)  # [T]
            shift = torch.repeat_interleave(starts - qstart[:-1], qlens, output_size=n_tok)
            positions = torch.arange(n_tok, device=self.device) + shift  # [T]
            if slots:
                seq_slots = torch.repeat_interleave(seq_slots, qlens, output_size=n_tok)  # [T]
        block = self.tables.view(-1).index_select(0, tok_rows * stride + positions // bs)  # [T]
        width = -(-max(h.lens) // bs)
        meta = AttentionMetadata(
            slot_mapping=block.long() * bs + positions % bs,
            query_start=qstart.int(),
            seq_lens=(starts + qlens).int(),
            block_tables=self.tables[:, :width].index_select(0, rows),  # [B, width]
            query_lens_cpu=[b - a for a, b in zip(h.qstart, h.qstart[1:], strict=False)],
            seq_lens_cpu=h.lens,
            block_size=bs,
            num_prefills=num_chunks,
        )
        inputs = StepInputs(ids, positions, meta, sample_at, h.sample_seqs, sample_row, pool=h.pool)
        if n_fut:
            inputs.future_at, inputs.future_rows = fut_at, fut_row
        if slots:
            inputs.lora_slots = seq_slots
        return inputs


@dataclass
class _HostLists:
    """What one step sends to the device, gathered on the host (each a Python list)."""

    ids: list[int] = field(default_factory=list)  # [T] token ids; 0 where the future buffer feeds
    fut_at: list[int] = field(default_factory=list)  # token indices fed from the future buffer
    fut_row: list[int] = field(default_factory=list)  # ... from these rows
    rows: list[int] = field(default_factory=list)  # [B] persistent row per sequence
    slots: list[int] = field(default_factory=list)  # [B] LoRA slot per sequence (0: base model)
    starts: list[int] = field(default_factory=list)  # [B] first position fed
    qstart: list[int] = field(default_factory=lambda: [0])  # [B + 1] cumulative new tokens
    lens: list[int] = field(default_factory=list)  # [B] context length after the step
    sample_at: list[int] = field(default_factory=list)  # [S] token index of each sampled logit
    sample_row: list[int] = field(default_factory=list)  # [S]
    sample_seqs: list[Seq] = field(default_factory=list)  # [S]
    offsets: list[int] = field(default_factory=list)  # [<= S] position in the verify run (see build)
    writes: list[tuple[int, int, int]] = field(default_factory=list)  # (row, column, block)
    pool: list[PoolRows] = field(default_factory=list)  # embedding chunks
