"""The handoff (stream.handoff): a producer may wait until the consumer has *handled* what it took."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from rillet.core.outputs import SeqDelta, StepOutput
from rillet.core.ring import SpscRing
from rillet.http.stream.dispatcher import Dispatcher
from rillet.http.stream.request_stream import RequestStream


def _step(i: int) -> StepOutput:
    return StepOutput(i, [SeqDelta("r", 0, [7], "x", None, None, 3, 0, i)])


def _waiter(ring: SpscRing[int], timeout: float) -> tuple[threading.Thread, list[tuple[bool, float]]]:
    result: list[tuple[bool, float]] = []

    def wait() -> None:
        t0 = time.monotonic()
        ok = ring.wait_released(timeout)
        result.append((ok, time.monotonic() - t0))

    t = threading.Thread(target=wait)
    t.start()
    return t, result


def test_a_consumer_that_does_not_release_never_blocks_the_producer() -> None:
    ring: SpscRing[int] = SpscRing(8)
    ring.set_notifier(lambda: None)  # releases=False: the offline LLM's consumer, tests
    ring.push(1)
    # Nobody ever releases here: a wait would end in its timeout (False, counted), not in True.
    assert ring.wait_released(5.0) and ring.release_timeouts == 0
    ring.set_notifier(None, releases=True)  # no consumer attached: nobody would release
    assert not ring.consumer_releases and ring.wait_released(5.0)


def test_the_producer_waits_until_release_not_just_pop() -> None:
    ring: SpscRing[int] = SpscRing(8)
    ring.set_notifier(lambda: None, releases=True)
    ring.push(1)
    t, result = _waiter(ring, 5.0)
    assert ring.pop_all() == [1]
    time.sleep(0.05)
    assert not result  # popped, not yet handled (a waiter that has not started yet also passes)
    ring.release()
    t.join(30)
    assert result and result[0][0] and ring.release_timeouts == 0  # released, not timed out
    assert ring.wait_released(5.0)  # nothing new since: at once


def test_release_covers_only_what_was_popped() -> None:
    ring: SpscRing[int] = SpscRing(8)
    ring.set_notifier(lambda: None, releases=True)
    ring.push(1)
    ring.pop_all()
    ring.push(2)  # pushed after the pop: the release below does not cover it
    ring.release()
    assert not ring.wait_released(0.02)
    ring.pop_all()
    ring.release()
    assert ring.wait_released(0.02)


def test_the_wait_is_bounded_and_ends_on_close_or_detach() -> None:
    ring: SpscRing[int] = SpscRing(8)
    ring.set_notifier(lambda: None, releases=True)
    ring.push(1)
    t, result = _waiter(ring, 0.05)
    t.join(30)
    assert result[0][0] is False and result[0][1] >= 0.04  # timed out: the engine goes on
    assert ring.release_timeouts == 1
    # The two waits below would each time out only after 30 s; the joins outlast that, so a wait
    # that ended by timing out shows as a counted timeout, not as a missing result.
    t, result = _waiter(ring, 30.0)
    time.sleep(0.02)  # usually already waiting; if not, it finds nobody releasing: same end
    ring.set_notifier(None)  # the dispatcher detached: nobody will release
    t.join(60)
    assert result and ring.release_timeouts == 1  # ended by the detach: a detach is not a timeout
    ring.set_notifier(lambda: None, releases=True)
    ring.push(2)
    t, result = _waiter(ring, 30.0)
    time.sleep(0.02)
    ring.close()
    t.join(60)
    assert result and ring.release_timeouts == 1  # ended by the close, not by its timeout


class _Socket:
    """A direct writer (transport_write.py's interface) that notes, at each write, whether the
    engine had been released already."""

    def __init__(self, ring: SpscRing[StepOutput]) -> None:
        self.ring = ring
        self.writes: list[tuple[bytes, bool]] = []

    def ready(self) -> bool:
        return True

    def __call__(self, data: bytes) -> None:
        self.writes.append((data, self.ring._released >= self.ring._head))

    def frame(self, head: bytes, body: bytes, tail: bytes) -> bytes:
        return head + body + tail

    def raw(self, data: bytes) -> None:
        self(data)


@pytest.mark.parametrize("write_last", [True, False])
def test_the_dispatcher_writes_as_formatted_or_after_the_release(write_last: bool) -> None:
    """stream.write_order: by default each write goes out as it is formatted, before the engine
    that hands off is released (its model run then never shares the core with the sends); with
    `write_last` (after_release) route and format, release the engine, then write."""

    async def scenario() -> tuple[list[tuple[bytes, bool]], bool]:
        ring: SpscRing[StepOutput] = SpscRing(16)
        disp = Dispatcher(ring, lambda rid: None, 10_000, write_last=write_last)
        stream = RequestStream("r", 1)
        disp.register("r", stream)
        socket = _Socket(ring)
        stream.flusher = lambda: (stream.post(socket, stream.take()[0].text.encode()), True)[1]
        disp.attach(asyncio.get_running_loop())
        assert ring.consumer_releases
        released: list[bool] = []

        def engine() -> None:
            ring.push(_step(1))
            released.append(ring.wait_released(5.0))

        t = threading.Thread(target=engine)
        t.start()
        while t.is_alive():
            await asyncio.sleep(0.001)
        disp.detach()
        return socket.writes, released[0]

    writes, released = asyncio.run(scenario())
    assert writes == [(b"x", write_last)] and released
