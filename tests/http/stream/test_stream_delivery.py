"""Delivery from the dispatcher to a request's consumer: once per routing pass, and for a consumer
that only wants the end (non-streaming), no wake-up per token."""

from __future__ import annotations

import asyncio

from rillet.core.outputs import SeqDelta, StepOutput
from rillet.core.ring import SpscRing
from rillet.core.sequence import FinishReason
from rillet.http.stream.dispatcher import Dispatcher
from rillet.http.stream.request_stream import RequestStream


def delta(text: str, finish: FinishReason | None = None) -> SeqDelta:
    return SeqDelta("r", 0, [1], text, None, finish, 3, 0, 0)


def test_an_end_only_consumer_wakes_at_the_end_not_per_token() -> None:
    async def scenario() -> tuple[bool, bool]:
        stream = RequestStream("r", 1)
        stream.wake_tokens = 1000
        waiter = asyncio.ensure_future(stream.wait())
        await asyncio.sleep(0)
        for ch in "abc":
            stream.push(delta(ch))
            stream.deliver()
        await asyncio.sleep(0)
        woken_early = waiter.done()
        stream.push(delta("d", FinishReason.LENGTH))
        stream.deliver()
        await asyncio.sleep(0)
        return woken_early, waiter.done()

    assert asyncio.run(scenario()) == (False, True)


def test_the_threshold_bounds_what_piles_up() -> None:
    async def scenario() -> int:
        stream = RequestStream("r", 1)
        stream.wake_tokens = 2
        waiter = asyncio.ensure_future(stream.wait())
        await asyncio.sleep(0)
        stream.push(delta("a"))
        stream.deliver()
        await asyncio.sleep(0)
        assert not waiter.done()
        stream.push(delta("b"))
        stream.deliver()
        await asyncio.sleep(0)
        assert waiter.done()
        return stream.pending_tokens

    assert asyncio.run(scenario()) == 2


def test_a_routing_pass_delivers_each_stream_once_however_many_steps_it_took() -> None:
    flushes: list[int] = []

    async def scenario() -> None:
        ring: SpscRing[StepOutput] = SpscRing(16)
        disp = Dispatcher(ring, abort=lambda rid: None, max_buffered_tokens=1000)
        stream = RequestStream("r", 1)

        def flush() -> bool:
            flushes.append(len(stream.take()))
            return True

        stream.flusher = flush
        disp.register("r", stream)
        disp.route([StepOutput(i, [delta(ch)]) for i, ch in enumerate("abcd")])  # 4 steps, 1 pass

    asyncio.run(scenario())
    assert flushes == [4]


def test_a_non_streaming_collector_folds_deltas_as_they_come() -> None:
    """collect() sets the stream's sink: deltas are folded into the result when pushed, nothing is
    kept pending (no objects piling up until the end), and the consumer wakes once, at the end."""
    from rillet.http.openai.chunks import Usage
    from rillet.http.stream.collect import collect

    async def scenario() -> tuple[list[int], str, str | None, int]:
        stream = RequestStream("r", 1)
        stream.push(delta("a"))  # before the consumer runs: taken when it starts
        task = asyncio.ensure_future(collect(stream, usage := Usage([3], 1), False))
        await asyncio.sleep(0)
        pending = []
        for i, ch in enumerate("bcd"):
            stream.push(SeqDelta("r", 0, [1], ch, None, None, 3, 0, i + 2))
            stream.deliver()
            pending.append(len(stream.pending))
            await asyncio.sleep(0)
            assert not task.done()
        stream.push(SeqDelta("r", 0, [1], "e", None, FinishReason.LENGTH, 3, 0, 5))
        stream.deliver()
        (result,) = await task
        assert stream.sink is None
        return pending, result.text, result.finish_reason, usage.completion_tokens

    assert asyncio.run(scenario()) == ([0, 0, 0], "abcde", "length", 5)


def test_a_non_streaming_collector_raises_a_failed_choice_at_the_end() -> None:
    import pytest
    from rillet.http.openai.chunks import Usage
    from rillet.http.openai.errors import ApiError
    from rillet.http.stream.collect import collect

    async def scenario() -> None:
        stream = RequestStream("r", 1)
        task = asyncio.ensure_future(collect(stream, Usage([3], 1), False))
        await asyncio.sleep(0)
        stream.push(SeqDelta("r", 0, [1], "x", None, FinishReason.ERROR, 3, 0, 1, error="model step failed"))
        stream.deliver()
        with pytest.raises(ApiError):
            await task

    asyncio.run(scenario())
