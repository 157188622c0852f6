"""The engine thread: requests added and aborted from other threads while it runs."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from engine_hooks import hold_steps, scheduled_batches
from rillet.core.config import config_from_dict
from rillet.core.engine.engine import Engine
from rillet.core.engine.inbox import Inbox, NewEmbedding, NewRequest
from rillet.core.errors import QueueFullError
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason


@pytest.fixture(scope="module")
def llm() -> LLM:
    c = config_from_dict({"model": {"dtype": "float32", "device": "cpu"}, "cache": {"num_blocks": 256}})
    with LLM(c) as m:
        yield m


def test_abort_from_another_thread_frees_blocks_within_one_step(llm: LLM) -> None:
    eng = llm.engine
    ids = llm.tokenizer.encode("Tell me a very long story about a dragon.")
    aborted = threading.Event()
    # The abort arrives while the engine is inside a step (held there until the abort is in, so
    # how many steps it would otherwise run meanwhile on this machine does not matter).
    mid_generation = lambda batch: eng.core.generated_tokens >= 3  # noqa: E731
    with hold_steps(eng, until=lambda batch: aborted.is_set(), when=mid_generation) as holding:
        eng.add_request("long", ids, SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True))
        assert holding.wait(60)
        assert eng.stats().kv_blocks_used > 0
        step_at_abort = eng.core.steps  # the step in progress
        t = threading.Thread(target=eng.abort, args=("long",))
        t.start()
        t.join()
        aborted.set()
        assert eng.wait_idle(30)
    assert eng.stats().kv_blocks_used == 0
    assert eng.core.steps == step_at_abort  # freed once the step in progress ended: no step more
    # the final delta says ABORT
    finals = [d for s in eng.ring.pop_all() for d in s.deltas if d.finish_reason is not None]
    assert any(d.request_id == "long" and d.finish_reason is FinishReason.ABORT for d in finals)
    eng.core.blocks.check_integrity()


def test_requests_added_from_many_threads_all_finish(llm: LLM) -> None:
    eng = llm.engine
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    ids = llm.tokenizer.encode("Count with me:")

    def producer(t: int) -> None:
        for i in range(3):
            eng.add_request(f"t{t}-{i}", ids, params)

    threads = [threading.Thread(target=producer, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    finished: dict[str, int] = {}
    deadline = time.monotonic() + 60
    while len(finished) < 12 and time.monotonic() < deadline:
        for step in eng.ring.pop_all():
            for d in step.deltas:
                if d.finish_reason is not None:
                    finished[d.request_id] = d.completion_tokens
        time.sleep(0.005)
    assert finished == {f"t{t}-{i}": 4 for t in range(4) for i in range(3)}
    assert eng.wait_idle(5) and eng.stats().kv_blocks_used == 0


def test_bad_requests_are_rejected_up_front(llm: LLM) -> None:
    eng = llm.engine
    with pytest.raises(ValueError, match="prompt"):
        eng.add_request("empty", [], SamplingParams())
    with pytest.raises(ValueError, match="context length"):
        eng.add_request("huge", [1] * 10, SamplingParams(max_tokens=eng.max_model_len))


def test_queue_full_raises() -> None:
    c = config_from_dict(
        {"model": {"kind": "synthetic", "synthetic_step_ms": 50.0}, "scheduler": {"max_waiting": 2}}
    )
    eng = Engine(c)  # not started: nothing leaves the inbox
    p = SamplingParams(max_tokens=2)
    eng.add_request("a", [5, 6], p)
    eng.add_request("b", [5, 6], p)
    with pytest.raises(QueueFullError):
        eng.add_request("c", [5, 6], p)


def test_requests_added_together_are_scheduled_together(llm: LLM) -> None:
    """add_requests (LLM.generate's way) queues its requests as one inbox item: the step that
    first schedules any of them schedules all of them, however the engine thread is timed."""
    eng = llm.engine
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    with scheduled_batches(eng) as batches:
        for round_ in range(5):
            rids = [f"r{round_}-{i}" for i in range(3)]
            eng.add_requests([NewRequest(rid, [5 + i, 6, 7], params) for i, rid in enumerate(rids)])
            assert eng.wait_idle(30)
            first = next(b for b in batches if b & set(rids))
            assert first >= set(rids), batches
            eng.ring.pop_all()
    assert eng.stats().kv_blocks_used == 0


def test_add_requests_queues_all_or_none() -> None:
    c = config_from_dict(
        {"model": {"kind": "synthetic", "synthetic_step_ms": 50.0}, "scheduler": {"max_waiting": 2}}
    )
    eng = Engine(c)  # not started: nothing leaves the inbox
    p = SamplingParams(max_tokens=2)
    with pytest.raises(QueueFullError):
        eng.add_requests([NewRequest(r, [5, 6], p) for r in "abc"])
    with pytest.raises(ValueError, match="prompt"):
        eng.add_requests([NewRequest("a", [5, 6], p), NewRequest("empty", [], p)])
    assert eng.stats().waiting == 0
    eng.add_requests([NewRequest(r, [5, 6], p) for r in "ab"])
    assert eng.stats().waiting == 2


def test_embedding_inputs_are_queued_as_one_all_or_none() -> None:
    """One /v1/embeddings request's inputs (add_embeddings, LLM.embed's way too): a refused input
    or a full queue queues none of them; accepted, the step that first schedules any of them
    schedules all."""
    synthetic = {"kind": "synthetic", "synthetic_step_ms": 1.0, "task": "both"}
    c = config_from_dict({"model": synthetic, "scheduler": {"max_waiting": 3}})
    eng = Engine(c)  # not started yet: nothing leaves the inbox
    try:
        with pytest.raises(QueueFullError):
            eng.add_embeddings([NewEmbedding(r, [5, 6]) for r in "abcd"])
        with pytest.raises(ValueError, match="input"):
            eng.add_embeddings([NewEmbedding("a", [5, 6]), NewEmbedding("empty", [])])
        assert eng.stats().waiting == 0
        eng.start()
        with scheduled_batches(eng) as batches:
            for round_ in range(5):
                rids = [f"e{round_}-{i}" for i in range(3)]
                eng.add_embeddings([NewEmbedding(rid, [5 + i, 6, 7]) for i, rid in enumerate(rids)])
                assert eng.wait_idle(30)
                first = next(b for b in batches if b & set(rids))
                assert first >= set(rids), batches
                outs = eng.ring.pop_all()
                done = {d.request_id for o in outs for d in o.deltas if d.embedding is not None}
                assert done == set(rids)
        assert eng.stats().kv_blocks_used == 0
    finally:
        eng.shutdown()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OS thread names: Linux")
def test_the_engine_thread_is_named_for_the_os(llm: LLM) -> None:
    """`top -H`, perf, py-spy and the benchmarks (bench/lib/timed_batch.py) tell it by this name."""
    tid = llm.engine._thread.native_id if llm.engine._thread is not None else None
    assert tid is not None
    assert Path(f"/proc/self/task/{tid}/comm").read_text().strip() == "rillet-engine"


def test_inbox_calls_run_at_the_drain_and_never_leave_a_caller_waiting() -> None:
    inbox = Inbox(threading.Event())
    core = object()  # drain hands each call the core it drains into
    got = inbox.call(lambda c: c)
    failed = inbox.call(lambda c: 1 // 0)
    given_up = inbox.call(lambda c: pytest.fail("ran after its caller gave up"))
    assert given_up.cancel() and not got.done()
    assert inbox.drain(core) == []  # type: ignore[arg-type]
    assert got.result(0) is core
    assert isinstance(failed.exception(0), ZeroDivisionError)
    orphan = inbox.call(lambda c: c)
    inbox.cancel_calls("the engine stopped")  # the engine thread is gone: no drain will come
    with pytest.raises(RuntimeError, match="the engine stopped"):
        orphan.result(0)
