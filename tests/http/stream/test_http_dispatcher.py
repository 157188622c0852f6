"""The engine -> loop hand-off: the SPSC ring, wake-ups, routing, and the per-stream buffer bound."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from http_doubles.stream_deltas import chat_format
from http_helpers import sse_events, until, wait_for
from rillet.core.config import StreamConfig
from rillet.core.errors import ErrorKind
from rillet.core.outputs import SeqDelta, StepOutput
from rillet.core.ring import SpscRing
from rillet.core.sequence import FinishReason
from rillet.http.openai.chunks import Usage
from rillet.http.stream.dispatcher import Dispatcher
from rillet.http.stream.request_stream import RequestStream
from rillet.http.stream.sse import pump_sse


def parked(ring: SpscRing[StepOutput]) -> bool:
    """The dispatcher has raised the ring's waiting flag: it is parked (the test runs on the same
    loop, so it cannot be inside its callback)."""
    return ring._waiting


def step(i: int, rid: str = "r", ntok: int = 1, index: int = 0) -> StepOutput:
    return StepOutput(i, [SeqDelta(rid, index, [7] * ntok, "x" * ntok, None, None, 3, 0, i)])


def test_ring_wraps_around_in_order() -> None:
    ring: SpscRing[int] = SpscRing(4)
    seen: list[int] = []
    for i in range(0, 30, 3):
        for j in range(3):
            assert ring.try_push(i + j)
        seen += ring.pop_all()
    assert seen == list(range(30)) and len(ring) == 0


def test_full_ring_makes_the_producer_wait_never_overwrite() -> None:
    ring: SpscRing[int] = SpscRing(4)
    for i in range(4):
        ring.push(i)
    assert not ring.try_push(99)
    pushed = threading.Event()

    def producer() -> None:
        ring.push(4)  # blocks until the consumer frees a slot
        pushed.set()

    t = threading.Thread(target=producer)
    t.start()
    wait_for(lambda: ring.full_waits == 1, 30, "the producer to find the ring full")
    assert not pushed.is_set()  # it found the ring full and waits: it cannot push until a pop
    assert ring.pop_all() == [0, 1, 2, 3]
    t.join(30)
    assert pushed.is_set() and ring.pop_all() == [4]
    with pytest.raises(TimeoutError):
        for i in range(5):
            ring.push(i, timeout=0.01)


def test_a_busy_loop_gets_one_wakeup_for_many_steps() -> None:
    """Steps pushed while the loop is busy cost no wake-up; a parked dispatcher costs one per step."""

    async def scenario() -> tuple[int, int, int]:
        ring: SpscRing[StepOutput] = SpscRing(64)
        disp = Dispatcher(ring, lambda rid: None, 10_000)
        stream = RequestStream("r", 1)
        disp.register("r", stream)
        disp.attach(asyncio.get_running_loop())
        await until(lambda: parked(ring), "dispatcher parked")
        # 1) the loop is busy (blocked) while the engine pushes 20 steps
        producer = threading.Thread(target=lambda: [ring.push(step(i)) for i in range(20)])
        producer.start()
        producer.join()
        busy_wakeups = ring.wakeups  # at most the one for the first push after parking
        await until(lambda: disp.steps_routed == 20 and parked(ring), "the 20 steps routed")
        routed_busy = len(stream.take())
        # 2) the loop idles between steps (the dispatcher is parked again before each push): one
        # wake-up each
        for i in range(5):
            ring.push(step(100 + i))
            routed = 21 + i
            await until(lambda: disp.steps_routed == routed and parked(ring), "the step routed")  # noqa: B023
        disp.detach()
        return busy_wakeups, routed_busy, ring.wakeups - busy_wakeups

    busy_wakeups, routed, idle_wakeups = asyncio.run(scenario())
    assert busy_wakeups == 1 and routed == 20
    assert idle_wakeups == 5


def test_engine_thread_steps_never_wake_the_loop_more_than_once_each() -> None:
    async def scenario() -> tuple[int, int, int]:
        ring: SpscRing[StepOutput] = SpscRing(16)
        disp = Dispatcher(ring, lambda rid: None, 10_000)
        stream = RequestStream("r", 1)
        disp.register("r", stream)
        disp.attach(asyncio.get_running_loop())
        await until(lambda: parked(ring), "dispatcher parked")  # the first push must wake it
        steps = 300

        def engine() -> None:
            for i in range(steps):
                ring.push(step(i))
                if i % 3 == 0:
                    time.sleep(0.0005)

        t = threading.Thread(target=engine)
        t.start()
        got = 0
        while got < steps:
            await stream.wait()
            got += len(stream.take())
        t.join(30)
        disp.detach()
        return steps, ring.wakeups, disp.wakeups

    steps, wakeups, woken = asyncio.run(scenario())
    assert 0 < wakeups <= steps and woken <= wakeups + 1  # + the callback at attach


def test_routing_offsets_choice_indices_and_drops_unregistered() -> None:
    async def scenario() -> None:
        ring: SpscRing[StepOutput] = SpscRing(8)
        disp = Dispatcher(ring, lambda rid: None, 10_000)
        stream = RequestStream("req", 4, ("req-0", "req-1"))
        disp.register("req-0", stream, 0)
        disp.register("req-1", stream, 2)
        disp.route([StepOutput(1, [step(1, "req-1", index=1).deltas[0], step(1, "gone").deltas[0]])])
        assert [d.index for d in stream.take()] == [3]
        disp.unregister("req-1")
        disp.route([step(2, "req-1")])
        assert stream.take() == []

    asyncio.run(scenario())


def test_a_reader_too_far_behind_is_cut_off_and_aborted() -> None:
    async def scenario() -> tuple[list[str], RequestStream]:
        aborted: list[str] = []
        ring: SpscRing[StepOutput] = SpscRing(8)
        disp = Dispatcher(ring, aborted.append, max_buffered_tokens=5)
        stream = RequestStream("req", 2, ("req-0", "req-1"))
        disp.register("req-0", stream, 0)
        disp.register("req-1", stream, 1)
        disp.route([step(1, "req-0", ntok=3)])
        assert stream.failure is None
        disp.route([step(2, "req-0", ntok=3)])  # 6 tokens waiting > 5
        assert disp.active == 0
        return aborted, stream

    aborted, stream = asyncio.run(scenario())
    assert aborted == ["req-0", "req-1"]
    assert stream.failure is not None and stream.failure.code == "stream_buffer_full"


def test_tokens_routed_with_an_engine_dead_end_reach_the_client_before_its_error() -> None:
    """A dying engine salvages its held step, then fails every request (engine.py): one routing
    pass may carry both. The salvaged tokens are the client's: the pump sends them, then the 503."""

    async def scenario() -> list[bytes]:
        ring: SpscRing[StepOutput] = SpscRing(8)
        disp = Dispatcher(ring, lambda _id: None, max_buffered_tokens=1000)
        stream = RequestStream("r", 1)
        disp.register("r", stream)
        writes: list[bytes] = []

        async def write(data: bytes) -> None:
            writes.append(data)

        fmt = chat_format()
        task = asyncio.create_task(pump_sse(stream, fmt, Usage([3], 1), write, StreamConfig(), b""))
        await asyncio.sleep(0)
        dead = SeqDelta("r", 0, [], "", None, FinishReason.ERROR, 3, 0, 2)
        dead.error_kind = ErrorKind.ENGINE_DEAD
        disp.route([step(1, ntok=2), StepOutput(2, [dead])])
        await asyncio.wait_for(task, 5)
        return writes

    events = [e for w in asyncio.run(scenario()) for e in sse_events(w) if e != "[DONE]"]
    texts = [e["choices"][0]["delta"].get("content", "") for e in events if "choices" in e]
    assert "".join(texts) == "xx"
    assert events[-1]["error"]["code"] == "dead"
