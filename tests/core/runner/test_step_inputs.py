"""InputBuilder: per-step inputs from persistent device state equal the ones built from scratch,
table entries are sent only when they change, and pending tokens come from the future buffer."""

from __future__ import annotations

import random

import torch
from rillet.core.config import SchedulerConfig
from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.scheduler import ScheduledBatch, Scheduler
from rillet.core.runner.input_builder import InputBuilder
from rillet.core.runner.step_inputs import StepInputs, order_batch
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason, Seq

CPU = torch.device("cpu")


def reference(batch: ScheduledBatch, block_size: int) -> dict[str, list]:
    """The inputs computed directly from the sequences (as build_inputs did before the builder)."""
    ids, pos, slots, qstart, lens, tables = [], [], [], [0], [], []
    for seq, n in order_batch(batch):
        start, end = seq.num_computed, seq.num_computed + n
        ids += seq.tokens(start, end)
        pos += range(start, end)
        slots += [seq.block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]
        qstart.append(qstart[-1] + n)
        lens.append(end)
        tables.append(list(seq.block_table))
    return {"ids": ids, "pos": pos, "slots": slots, "qstart": qstart, "lens": lens, "tables": tables}


def check(inp: StepInputs, ref: dict[str, list]) -> None:
    m = inp.meta
    assert inp.input_ids.tolist() == ref["ids"]
    assert inp.positions.tolist() == ref["pos"]
    assert m.slot_mapping.tolist() == ref["slots"]
    assert m.query_start.tolist() == ref["qstart"]
    assert m.seq_lens.tolist() == ref["lens"] == m.seq_lens_cpu
    rows = m.block_tables.tolist()
    for row, table, length in zip(rows, ref["tables"], ref["lens"], strict=True):
        used = -(-length // m.block_size)
        assert row[:used] == table[:used]
        assert all(b == 0 for b in row[len(table) :])  # nothing stale from a row's earlier holder


def test_builder_matches_a_from_scratch_build_through_preemption_and_turnover() -> None:
    rng = random.Random(0)
    bs = 4
    sched = Scheduler(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=20), BlockManager(18, bs))
    builder = InputBuilder(bs, CPU, rows=2, width=2)  # small: rows and width must grow
    seqs = [
        Seq(i, f"r{i}", [rng.randrange(1, 99) for _ in range(rng.randrange(1, 30))], SamplingParams())
        for i in range(14)
    ]
    for seq in seqs:
        sched.add(seq)
    steps = preempted = 0
    while sched.has_work():
        batch = sched.schedule()
        preempted += len(batch.preempted)
        inp = builder.build(batch)
        check(inp, reference(batch, bs))
        for seq, n in zip(batch.seqs, batch.num_new, strict=True):
            seq.num_computed += n
            if seq.num_computed == seq.num_tokens:
                seq.output_ids.append(rng.randrange(1, 99))
                if len(seq.output_ids) >= 3 + seq.seq_id % 9:
                    sched.finish(seq, FinishReason.LENGTH)
                    builder.release(seq)
        steps += 1
        assert steps < 500
    assert preempted > 0 and builder.num_rows == 0
    sched.blocks.check_integrity()


def test_only_changed_table_entries_are_sent() -> None:
    """Decoding long sequences: one entry per sequence that crossed into a new block, not its whole table."""
    bs = 4
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048), BlockManager(400, bs))
    builder = InputBuilder(bs, CPU)
    seqs = [Seq(i, f"r{i}", list(range(1, 160)), SamplingParams(max_tokens=100)) for i in range(8)]
    for seq in seqs:
        sched.add(seq)
    for step in range(12):
        batch = sched.schedule()
        before = builder.entries_written
        builder.build(batch)
        sent = builder.entries_written - before
        if step == 0:
            assert sent == sum(len(s.block_table) for s in seqs)  # admission: whole rows
        else:  # decode of the token at position 159 + step - 1 (one row per new block)
            crossed = sum(1 for s in seqs if (s.num_computed) % bs == 0)
            assert sent == crossed
        for seq in seqs:
            seq.num_computed += 1 if step else seq.prompt_len
            seq.output_ids.append(7)


def test_a_pending_decode_input_comes_from_the_future_buffer() -> None:
    bs = 4
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64), BlockManager(40, bs))
    builder = InputBuilder(bs, CPU)
    a = Seq(0, "a", [5, 6, 7], SamplingParams())
    b = Seq(1, "b", [8, 9], SamplingParams())
    sched.add(a)
    sched.add(b)
    first = builder.build(sched.schedule())  # prefill both; both sample
    builder.store_sampled(first, torch.tensor([41, 42]))  # the device's tokens, unseen by the host
    for seq in (a, b):
        seq.num_computed = seq.num_tokens
        seq.num_pending = 1
    second = builder.build(sched.schedule())
    assert second.input_ids.tolist() == [0, 0]  # on the device, filled in device order:
    builder.resolve_future(second)
    assert second.input_ids.tolist() == [41, 42]
    assert second.positions.tolist() == [3, 2]
    assert [s.seq_id for s in second.sample_seqs] == [0, 1]
