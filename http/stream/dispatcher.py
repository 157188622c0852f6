"""The one consumer of the engine ring: a task on the event loop that routes deltas to request streams.

Wake-up protocol (core/ring.py): the dispatcher raises the ring's waiting flag just before it
parks on `_event`; the engine thread, after a push, sees the flag and calls the notifier, which
schedules `_event.set` on the loop. So a cross-thread wake-up happens at most once per engine step
and never while the dispatcher is busy; everything that piled up meanwhile is taken by one
`pop_all`. After routing, the dispatcher yields once so the writers it woke run before it looks
at the ring again; then it releases the ring, which lets an engine that hands off (see
`stream.handoff`) start its next model run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from rillet.core.errors import ErrorKind
from rillet.core.outputs import StepOutput
from rillet.core.ring import SpscRing
from rillet.http.metrics.registry import Metrics
from rillet.http.openai.errors import ApiError, engine_dead
from rillet.http.stream.request_stream import RequestStream

log = logging.getLogger(__name__)


class Dispatcher:
    def __init__(
        self,
        ring: SpscRing[StepOutput],
        abort: Callable[[str], None],
        max_buffered_tokens: int,
        metrics: Metrics | None = None,
    ) -> None:
        self._ring = ring
        self._abort = abort
        self._max_buffered = max_buffered_tokens
        self._metrics = metrics
        # engine request id -> (its request's stream, index of its first choice in that stream)
        self._routes: dict[str, tuple[RequestStream, int]] = {}
        self._event = asyncio.Event()
        self.wakeups = 0  # times the dispatcher was woken from its wait (tests: <= engine steps)
        self.steps_routed = 0

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        event = self._event

        def notify() -> None:  # engine thread; once per wait at most (see the ring)
            loop.call_soon_threadsafe(event.set)

        self._ring.set_notifier(notify, releases=True)

    def detach(self) -> None:
        self._ring.set_notifier(None)
        self._ring.cancel_wait()

    # ---- registry ------------------------------------------------------------------------------
    def register(self, engine_id: str, stream: RequestStream, base_index: int = 0) -> None:
        """Before `engine.add_request`, so that no delta can arrive unrouted."""
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

    # ---- the loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        ring, event = self._ring, self._event
        while True:
            outs = ring.pop_all()
            if outs:
                self.route(outs)
                await asyncio.sleep(0)  # the writers woken by route run here
                ring.release()  # an engine waiting to hand off (stream.handoff) may run its model
                continue
            event.clear()
            if ring.prepare_wait():
                await event.wait()
                self.wakeups += 1

    def route(self, outs: list[StepOutput]) -> None:
        """Appends every delta to its request's stream, then delivers each touched stream once.

        Delivery after the whole pass (not per delta) means one write or one wake-up per request
        per pass, however many engine steps the pass took from the ring.
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
                if d.error_kind is ErrorKind.ENGINE_DEAD:  # 503 "engine dead", not "your request failed"
                    stream.fail(engine_dead(d.error))
                    routes.pop(d.request_id, None)
                    continue
                stream.push(d)
                if not stream.touched:
                    stream.touched = True
                    touched.append(stream)
                if stream.pending_tokens > self._max_buffered:
                    self._cut_off(stream)
                elif stream.done_in_engine:
                    routes.pop(d.request_id, None)
        for stream in touched:
            stream.touched = False
            stream.deliver()
        if metrics is not None and tokens:
            metrics.generation_tokens.inc(tokens)

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
        await asyncio.sleep(0)
        self.fail_all(engine_dead(why()))
