"""Continuous batching, chunked prefill and preemption, driven by a fake model (no tensors)."""

from __future__ import annotations

from rillet.core.config import SchedulerConfig
from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.scheduler import ScheduledBatch, Scheduler
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason, Seq, SeqStatus


def make(num_blocks: int = 64, block_size: int = 4, seqs: int = 8, tokens: int = 64) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=tokens),
        BlockManager(num_blocks, block_size),
    )


def new(i: int, prompt_len: int, max_tokens: int = 4) -> Seq:
    return Seq(
        i, f"r{i}", [(i * 31 + k) % 97 + 1 for k in range(prompt_len)], SamplingParams(max_tokens=max_tokens)
    )


def fake_step(s: Scheduler, batch: ScheduledBatch) -> list[Seq]:
    """Advances like the engine: computed tokens grow, sampled tokens append, finished ones leave."""
    done = []
    for seq, n in zip(batch.seqs, batch.num_new, strict=True):
        seq.num_computed += n
        s.blocks.commit(seq)
        if seq.num_computed == seq.num_tokens:
            seq.output_ids.append(1000 + len(seq.output_ids))
            if len(seq.output_ids) >= seq.params.max_tokens:
                s.finish(seq, FinishReason.LENGTH)
                done.append(seq)
    return done


def run_all(s: Scheduler, limit: int = 1000) -> list[ScheduledBatch]:
    batches = []
    for _ in range(limit):
        if not s.has_work():
            break
        b = s.schedule()
        assert b.seqs, "scheduler stalled with work left"
        assert b.num_tokens <= s.cfg.max_num_batched_tokens
        assert len(s.running) <= s.cfg.max_num_seqs
        fake_step(s, b)
        s.blocks.check_integrity()
        batches.append(b)
    assert not s.has_work()
    assert s.blocks.num_used == 0
    return batches


def test_requests_join_and_leave_every_step() -> None:
    s = make()
    a = new(0, 5, max_tokens=2)
    s.add(a)
    b1 = s.schedule()
    assert b1.seqs == [a] and b1.num_new == [5]
    fake_step(s, b1)
    late = new(1, 3, max_tokens=5)
    s.add(late)  # joins while `a` decodes
    b2 = s.schedule()
    assert b2.seqs == [a, late] and b2.num_new == [1, 3]
    fake_step(s, b2)
    assert a.status is SeqStatus.FINISHED
    b3 = s.schedule()
    assert b3.seqs == [late]  # `a` left the batch
    run_all(s)


def test_chunked_prefill_respects_token_budget_and_mixes_with_decodes() -> None:
    s = make(tokens=8, seqs=4)
    short = new(0, 3, max_tokens=6)
    s.add(short)
    fake_step(s, s.schedule())
    long = new(1, 21, max_tokens=2)
    s.add(long)
    b = s.schedule()
    assert b.seqs == [short, long] and b.num_new == [1, 7]  # decode + a 7-token chunk
    fake_step(s, b)
    assert long.num_computed == 7 and not long.output_ids  # mid-prompt: nothing sampled
    batches = run_all(s)
    assert all(sum(x.num_new) <= 8 for x in batches)
    assert len(long.output_ids) == 2


def test_max_num_seqs_caps_the_running_batch() -> None:
    s = make(seqs=2)
    for i in range(5):
        s.add(new(i, 4))
    b = s.schedule()
    assert len(b.seqs) == 2 and len(s.waiting) == 3
    run_all(s)


def test_preemption_by_recompute_when_blocks_run_out() -> None:
    # 6 usable blocks of 4 tokens; two sequences of 8 + 12 output tokens cannot both fit.
    s = make(num_blocks=7, block_size=4, seqs=4, tokens=64)
    a, b = new(0, 8, max_tokens=12), new(1, 8, max_tokens=12)
    s.add(a)
    s.add(b)
    batches = run_all(s)
    assert any(x.preempted for x in batches)
    assert b.num_preemptions >= 1
    assert s.preemptions == a.num_preemptions + b.num_preemptions  # /metrics' counter
    # Output continued where it stopped: the fake model's tokens are 1000, 1001, ... with no gap.
    assert a.output_ids == list(range(1000, 1012)) and b.output_ids == list(range(1000, 1012))


def test_finish_while_waiting_frees_nothing_twice() -> None:
    s = make()
    x = new(0, 4)
    s.add(x)
    s.finish(x, FinishReason.ABORT)
    assert not s.has_work() and x.finish_reason is FinishReason.ABORT
    s.blocks.check_integrity()


def test_n_copies_wait_for_leader_prefill_then_share_its_blocks() -> None:
    s = make(num_blocks=64, block_size=4, tokens=64)
    leader = new(0, 13, max_tokens=3)
    copy = Seq(1, "r0", list(leader.prompt_ids), SamplingParams(max_tokens=3), index=1, leader=leader)
    s.add(leader)
    s.add(copy)
    b = s.schedule()
    assert b.seqs == [leader]
    fake_step(s, b)
    b = s.schedule()
    assert copy in b.seqs
    assert copy.num_cached == 12 and copy.block_table[:3] == leader.block_table[:3]
    run_all(s)
