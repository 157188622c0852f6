"""The one consumer of the engine ring: a reader callback on the event loop that routes deltas to
request streams, writes, and releases the engine.

Wake-up protocol (core/ring.py): the dispatcher raises the ring's waiting flag just before it
parks; the engine thread, after a push, sees the flag and wakes the loop through a `Waker` (an
eventfd the loop watches with `add_reader`). So a cross-thread wake-up happens at most once per
engine step and never while the dispatcher is busy. One callback then does everything, with no
task, future or `sleep(0)` hop between the engine and its next step:

  1. take every step that piled up (`pop_all`) and route its deltas to their streams; a stream
     whose socket is free formats its SSE bytes at once (sse.py's direct path) and writes them;
     others wake their coroutine;
  2. release the ring: an engine that hands off (`stream.handoff`) starts its next model run.
The writes go out in 1, so an engine that hands off waits for them (`stream.write_order:
as_formatted`). Held until after 2 (`after_release`: the bytes formatted in 1 wait in the outbox,
written as the loop's last act before it parks), the model run starts earlier, but with the loop
and a CPU model on one core streams did slightly worse at c = 8 (streamed / non-streamed, median
of runs 0.980 against 0.986; bench/RESULTS.md 2026-12-05). Without a handoff (CUDA, the null
engine) the engine never waits for the release, and holding the writes kept the GIL with the loop
for the whole pass, where a `send` per stream releases it to an engine thread that needs it for
its host work (issue 25; bench/RESULTS.md 2026-12-04: the null engine's streamed steps grew
0.7-2.4 % held, -0.4-0.6 % not).
Counters are plain ints owned by the loop (no lock per token); /metrics reads them at scrape time.

Engine first (`gate`: stream.engine_first, core/engine/handoff/gil_gate.py): every GIVE_WAY_EVERY
deliveries (each with its write: a gate comes only with an engine that does not hand off), the
callback gives way while the engine thread does its host work, so that its next launch is queued
before the device runs dry; the rest of the pass goes out once the engine waits for the device
again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from rillet.core.outputs import StepOutput
from rillet.core.ring import SpscRing
from rillet.http.metrics.registry import Metrics
from rillet.http.openai.errors import ApiError, engine_dead
from rillet.http.stream.request_stream import Outbox, RequestStream
from rillet.http.stream.waker import Waker

log = logging.getLogger(__name__)

GIVE_WAY_EVERY = 4  # streams delivered between two looks at the engine gate


class Gate(Protocol):
    def give_way(self) -> bool: ...


class Dispatcher:
    def __init__(
        self,
        ring: SpscRing[StepOutput],
        abort: Callable[[str], None],
        max_buffered_tokens: int,
        metrics: Metrics | None = None,
        gate: Gate | None = None,
        write_last: bool = False,
    ) -> None:
        """`write_last` (stream.write_order after_release): hold each pass's writes until the ring
        is released; False: write as formatted."""
        self._ring = ring
        self.write_last = write_last
        self._gate = gate
        self._abort = abort
        self._max_buffered = max_buffered_tokens
        self._metrics = metrics
        # engine request id -> (its request's stream, index of its first choice in that stream)
        self._routes: dict[str, tuple[RequestStream, int]] = {}
        self.outbox: Outbox = []  # (writer, bytes) formatted this pass, written after the release
        self._waker: Waker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.wakeups = 0  # reader callbacks run (tests: at most one per notification, plus the first)
        self.passes = 0  # routing passes (a callback makes more while steps keep arriving)
        self.steps_routed = 0
        self.tokens_routed = 0  # /metrics: rillet_generation_tokens_total
        self.cpu_seconds = 0.0  # this thread's CPU time inside the callback (/metrics)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Becomes the ring's consumer on `loop` (call it on that loop's thread)."""
        waker = self._waker = Waker()
        self._loop = loop
        self._ring.set_notifier(waker.wake, releases=True)
        loop.add_reader(waker.fileno(), self._on_wake)
        loop.call_soon(self._on_wake)  # whatever the engine pushed before this

    def detach(self) -> None:
        self._ring.set_notifier(None)
        self._ring.cancel_wait()
        if self._waker is not None and self._loop is not None:
            self._loop.remove_reader(self._waker.fileno())
            self._waker.close()
        self._waker = None

    # ---- registry ------------------------------------------------------------------------------
    def register(self, engine_id: str, stream: RequestStream, base_index: int = 0) -> None:
        """Before `engine.add_request`, so that no delta can arrive unrouted."""
        stream.outbox = self.outbox if self.write_last else None
        self._routes[engine_id] = (stream, base_index)

    def unregister(self, engine_id: str) -> None:
        self._routes.pop(engine_id, None)

    @property
    def active(self) -> int:
        return len(self._routes)

    def fail_all(self, error: ApiError) -> None:
        for stream, _ in list(self._routes.values()):
            stream.fail(error)
        self._routes.clear()
        self.write_outbox()

    # ---- the callback --------------------------------------------------------------------------
    def _on_wake(self) -> None:
        if self._waker is None:  # detached meanwhile
            return
        t0 = time.thread_time()
        self.wakeups += 1
        self._waker.clear()
        ring = self._ring
        while True:
            outs = ring.pop_all()
            if outs:
                self.passes += 1
                self.route(outs)
                ring.release()  # an engine waiting to hand off (stream.handoff) may run its model
                self.write_outbox()
                continue
            if ring.prepare_wait():  # parked: the next push wakes this callback again
                break
        self.cpu_seconds += time.thread_time() - t0

    def write_outbox(self) -> None:
        outbox = self.outbox
        if outbox:
            for write, data in outbox:
                write(data)
            outbox.clear()

    def route(self, outs: list[StepOutput]) -> None:
        """Appends every delta to its request's stream, then delivers each touched stream once.

        Delivery after the whole pass (not per delta) means one event or one wake-up per request
        per pass, however many engine steps the pass took from the ring. A direct write is only
        sent as formatted, or, with `write_last`, by `write_outbox` after the release.
        """
        routes = self._routes
        now = time.monotonic()
        tokens = 0
        metrics = self._metrics
        touched: list[RequestStream] = []
        for out in outs:
            self.steps_routed += 1
            for d in out.deltas:
                entry = routes.get(d.request_id)
                if entry is None:  # aborted or failed earlier: its late deltas go nowhere
                    continue
                stream, base = entry
                if base:
                    d.index += base
                k = len(d.token_ids)
                if k:
                    tokens += k
                    if metrics is not None:
                        metrics.token_times(stream, now, k, out.step)
                # An ENGINE_DEAD end is pushed like any ERROR end (finish_failure makes it the 503
                # "engine dead"), not failed at once: a failed stream's pending tokens, the step
                # the dying engine salvaged, would never be sent.
                stream.push(d)
                if not stream.touched:
                    stream.touched = True
                    touched.append(stream)
                if stream.pending_tokens > self._max_buffered:
                    self._cut_off(stream)
                elif stream.done_in_engine:
                    routes.pop(d.request_id, None)
        gate = self._gate
        for i, stream in enumerate(touched):
            if gate is not None and i % GIVE_WAY_EVERY == 0:
                gate.give_way()
            stream.touched = False
            stream.deliver()
        self.tokens_routed += tokens

    def _cut_off(self, stream: RequestStream) -> None:
        log.warning(
            "request %s cut off: its client fell %d tokens behind (stream.max_buffered_tokens = %d)",
            stream.request_id,
            stream.pending_tokens,
            self._max_buffered,
        )
        stream.fail(
            ApiError(
                500,
                "the client did not read the stream fast enough; the request was stopped",
                type="server_error",
                code="stream_buffer_full",
            )
        )
        for engine_id in stream.engine_ids:
            self._routes.pop(engine_id, None)
            self._abort(engine_id)
        if stream.on_cut is not None:
            stream.on_cut()

    async def watch(
        self, healthy: Callable[[], bool], why: Callable[[], str | None], interval: float
    ) -> None:
        """Fails every open request once the engine is dead (they would otherwise wait forever)."""
        while healthy():
            await asyncio.sleep(interval)
        self.route(self._ring.pop_all())
        self.write_outbox()
        await asyncio.sleep(0)
        self.fail_all(engine_dead(why()))
