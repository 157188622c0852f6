"""scheduler.policy priority, driven by a fake model (no tensors): waiting sequences admitted by
(priority, arrival), a better one taking a worse running one's batch place, the worst priority
preempted first for blocks, aging by scheduler.max_wait_s; fcfs keeps arrival order."""

from __future__ import annotations

from rillet.core.config import SchedulerConfig
from rillet.core.embedding import EmbedParams
from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.scheduler import ScheduledBatch, Scheduler
from rillet.core.engine.scheduling.priority import PriorityOrder
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason, Seq, SeqStatus


class Clock:
    """A monotonic clock the test steps: arrivals and ages without sleeping."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(
    clock: Clock,
    seqs: int = 2,
    blocks: int = 64,
    tokens: int = 64,
    policy: str = "priority",
    max_wait_s: float | None = None,
) -> Scheduler:
    cfg = SchedulerConfig(
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        policy=policy,  # type: ignore[arg-type]
        max_wait_s=max_wait_s,
    )
    s = Scheduler(cfg, BlockManager(blocks, 4))
    if s.order is not None:
        s.order = PriorityOrder(max_wait_s, clock)
    return s


def new(clock: Clock, i: int, priority: int = 0, prompt_len: int = 5, max_tokens: int = 4) -> Seq:
    prompt = [(i * 31 + k) % 97 + 1 for k in range(prompt_len)]
    seq = Seq(i, f"r{i}", prompt, SamplingParams(max_tokens=max_tokens), arrival=clock.t)
    seq.priority = priority
    clock.t += 0.001  # distinct arrivals, in creation order
    return seq


def fake_step(s: Scheduler, batch: ScheduledBatch) -> None:
    """As the engine: computed tokens grow, a sampled token appends, finished sequences leave."""
    for seq, n in zip(batch.seqs, batch.num_new, strict=True):
        seq.num_computed += n
        s.blocks.commit(seq)
        if seq.num_computed == seq.num_tokens:
            seq.output_ids.append(1000 + len(seq.output_ids))
            if len(seq.output_ids) >= seq.params.max_tokens:
                s.finish(seq, FinishReason.LENGTH)


def run_all(s: Scheduler, clock: Clock, order: list[Seq] | None = None) -> None:
    """Steps to the end (1 s a step); `order` gets each sequence as it is first scheduled."""
    for _ in range(500):
        if not s.has_work():
            break
        clock.t += 1.0
        batch = s.schedule()
        assert batch.seqs, "scheduler stalled with work left"
        assert len(s.running) <= s.cfg.max_num_seqs
        if order is not None:
            order.extend(q for q in batch.seqs if q not in order)
        fake_step(s, batch)
        s.blocks.check_integrity()
    assert not s.has_work()
    assert s.blocks.num_used == 0


def test_waiting_requests_are_admitted_by_priority_then_arrival() -> None:
    clock = Clock()
    s = make(clock, seqs=1)
    a, b, c, d = new(clock, 0, 0), new(clock, 1, 5), new(clock, 2, -1), new(clock, 3, 0)
    for q in (a, b, c, d):
        s.add(q)
    order: list[Seq] = []
    run_all(s, clock, order)
    assert order == [c, a, d, b]
    assert all(len(q.output_ids) == 4 for q in (a, b, c, d))


def test_fcfs_keeps_arrival_order_whatever_the_priority() -> None:
    clock = Clock()
    s = make(clock, seqs=1, policy="fcfs")
    assert s.order is None
    seqs = [new(clock, 0, 0), new(clock, 1, 5), new(clock, 2, -1)]
    for q in seqs:
        s.add(q)
    order: list[Seq] = []
    run_all(s, clock, order)
    assert order == seqs


def test_a_better_request_takes_the_worst_running_ones_batch_place() -> None:
    clock = Clock()
    s = make(clock, seqs=2)
    early, late = new(clock, 0, 0, max_tokens=8), new(clock, 1, 0, max_tokens=8)
    s.add(early)
    s.add(late)
    fake_step(s, s.schedule())  # both prefill and sample a token
    equal = new(clock, 2, 0)
    s.add(equal)
    batch = s.schedule()
    assert not batch.preempted and equal.status is SeqStatus.WAITING  # an equal priority waits
    fake_step(s, batch)
    urgent = new(clock, 3, -1, max_tokens=3)
    s.add(urgent)
    batch = s.schedule()
    assert batch.preempted == [late]  # equal priorities: the latest arrival gives way
    assert batch.seqs == [early, urgent] and batch.num_new == [1, 5]
    assert late.status is SeqStatus.WAITING and late.num_computed == 0 and late.block_table == []
    assert list(s.waiting) == [late, equal]  # it keeps its arrival: ahead of a later one
    assert s.preemptions == 1
    fake_step(s, batch)
    run_all(s, clock)
    assert [len(q.output_ids) for q in (early, late, equal, urgent)] == [8, 8, 4, 3]
    assert late.output_ids == [1000 + k for k in range(8)]  # continued where it stopped


def test_the_worst_priority_gives_way_before_a_later_arrival() -> None:
    clock = Clock()
    s = make(clock, seqs=2)
    batch_job, chat = new(clock, 0, 3, max_tokens=6), new(clock, 1, 1, max_tokens=6)
    s.add(batch_job)
    s.add(chat)
    fake_step(s, s.schedule())
    urgent = new(clock, 2, 0)
    s.add(urgent)
    assert s.schedule().preempted == [batch_job]
    run_all(s, clock)


def test_several_better_requests_displace_one_each_and_no_more() -> None:
    clock = Clock()
    s = make(clock, seqs=3)
    low = [new(clock, i, 5, max_tokens=6) for i in range(3)]
    for q in low:
        s.add(q)
    fake_step(s, s.schedule())
    high = [new(clock, 10 + i, 0, max_tokens=2) for i in range(2)]
    for q in high:
        s.add(q)
    batch = s.schedule()
    assert batch.preempted == [low[2], low[1]]  # worst first: the latest arrivals
    assert batch.seqs == [low[0], *high]
    run_all(s, clock)
    assert all(len(q.output_ids) == 6 for q in low)


def test_no_one_is_displaced_while_a_batch_place_is_free() -> None:
    clock = Clock()
    s = make(clock, seqs=3)
    low = new(clock, 0, 5, max_tokens=6)
    s.add(low)
    fake_step(s, s.schedule())
    urgent = new(clock, 1, 0)
    s.add(urgent)
    batch = s.schedule()
    assert not batch.preempted and batch.seqs == [low, urgent]
    run_all(s, clock)


def test_block_pressure_preempts_the_worst_priority_first() -> None:
    """Both prefill 8 tokens into 2 blocks each, and each decode then needs a third: 5 usable
    blocks hold one of them. fcfs preempts the latest admitted (b); priority the worst (a)."""
    for policy in ("fcfs", "priority"):
        clock = Clock()
        s = make(clock, seqs=4, blocks=6, policy=policy)
        a, b = new(clock, 0, 7, prompt_len=8, max_tokens=6), new(clock, 1, 0, prompt_len=8, max_tokens=6)
        s.add(a)
        s.add(b)
        fake_step(s, s.schedule())
        preempted: list[Seq] = []
        while not preempted:
            batch = s.schedule()
            preempted = batch.preempted
            fake_step(s, batch)
        expected = [b] if policy == "fcfs" else [a]
        assert preempted == expected, policy
        run_all(s, clock)
        assert len(a.output_ids) == len(b.output_ids) == 6


def test_aging_lets_a_long_waiting_request_pass_newer_better_ones() -> None:
    """A batch job (priority 1) behind a steady stream of priority 0 that outgrows the one batch
    place (a request a step, three steps each): with max_wait_s 10 it is passed only by requests up
    to 2 age steps younger, then runs ahead of the rest of the queue; without aging it starves."""
    for max_wait_s in (10.0, None):
        clock = Clock()
        s = make(clock, seqs=1, max_wait_s=max_wait_s)
        job = new(clock, 0, 1, max_tokens=2)
        s.add(job)
        order: list[Seq] = []
        for i in range(1, 60):
            s.add(new(clock, i, 0, max_tokens=2))
            clock.t += 1.0
            batch = s.schedule()
            order.extend(q for q in batch.seqs if q not in order)
            fake_step(s, batch)
        if max_wait_s is None:
            assert job not in order  # starved while the stream goes on
        else:
            before = order[: order.index(job)]
            assert job.finish_reason is FinishReason.LENGTH
            assert max(q.arrival for q in before) - job.arrival < 2 * max_wait_s
            assert len(s.waiting) > 10  # it passed a queue of younger ones
        run_all(s, clock)


def test_aging_can_displace_a_newer_running_request() -> None:
    clock = Clock()
    s = make(clock, seqs=1, max_wait_s=10.0)
    job = new(clock, 0, 1, max_tokens=2)
    clock.t += 20.0
    fresh = new(clock, 1, 0, max_tokens=20)
    s.add(fresh)
    fake_step(s, s.schedule())
    s.add(job)  # 20 s old: effective priority -1, better than fresh's 0
    clock.t += 1.0
    batch = s.schedule()
    assert batch.preempted == [fresh] and batch.seqs == [job]
    run_all(s, clock)
    assert len(fresh.output_ids) == 20


def test_the_queue_is_sorted_again_when_an_age_step_passes() -> None:
    clock = Clock()
    s = make(clock, seqs=1, max_wait_s=10.0)
    s.add(new(clock, 0, 0, max_tokens=40))  # holds the one place
    fake_step(s, s.schedule())
    old = new(clock, 1, 2)
    clock.t += 5.0
    young = new(clock, 2, 1)
    s.add(young)
    s.add(old)
    assert list(s.waiting) == [young, old]  # at 5 s: 2 vs 1
    clock.t += 6.0  # old is 11 s old: 2 - 1 = 1, and arrived first
    s.schedule()
    assert list(s.waiting) == [old, young]


def test_n_copies_and_mixed_priorities_under_block_pressure_all_complete() -> None:
    clock = Clock()
    s = make(clock, seqs=3, blocks=12, tokens=16, max_wait_s=5.0)
    leader = new(clock, 0, 2, prompt_len=9, max_tokens=7)
    s.add(leader)
    for k in range(1, 3):  # its n = 3 copies: the same prompt and priority
        copy = Seq(k, "r0", list(leader.prompt_ids), leader.params, arrival=leader.arrival, index=k)
        copy.leader, copy.priority = leader, leader.priority
        s.add(copy)
    fake_step(s, s.schedule())
    rest = [new(clock, 10 + i, (i * 7) % 4 - 1, prompt_len=3 + i % 5, max_tokens=3 + i % 4) for i in range(9)]
    for q in rest:
        s.add(q)
    run_all(s, clock)
    assert s.preemptions > 0
    assert all(len(q.output_ids) == q.params.max_tokens for q in rest)


def test_an_embedding_mid_prefill_keeps_its_place() -> None:
    """Embeddings are prompt-only and leave within a few steps: a better chat request waits for
    their place instead of making them recompute."""
    clock = Clock()
    s = make(clock, seqs=1, tokens=16)
    emb = new(clock, 0, 0, prompt_len=40, max_tokens=1)
    emb.embed = EmbedParams(None, False, False)
    s.add(emb)
    fake_step(s, s.schedule())  # its first 16-token chunk
    chat = new(clock, 1, -5)
    s.add(chat)
    batch = s.schedule()
    assert not batch.preempted and batch.seqs == [emb]
    order: list[Seq] = []
    fake_step(s, batch)
    run_all(s, clock, order)
    assert order[-1] is chat and emb.num_preemptions == 0
