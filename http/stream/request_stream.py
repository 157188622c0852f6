"""One request's pending output, between the dispatcher (producer) and its one consumer coroutine.

Both run on the event loop, so there is no locking: the dispatcher appends deltas in engine
order (`push`) and, once per routing pass, calls `deliver` on every stream it touched. Delivery
either hands the output straight to the stream's `flusher` (a streaming response whose socket is
free writes it at once, without waking its coroutine) or wakes the parked consumer; the consumer
takes everything pending at once. That hand-over is where coalescing comes from: whatever piled
up while the consumer was busy (writing to a slow socket) is taken in one go, in order, nothing
dropped. A consumer that only wants the end (non-streaming) sets a `sink` instead: each delta is
folded into its result as it arrives (text pieces, counts), nothing is kept pending, and the
consumer is woken once, at the end or on failure. Measured with the null engine (256 streams of
1,000 tokens, bench/RESULTS.md): holding every delta until the end kept ~256,000 objects alive,
whose garbage collections stretched steps by 5 %, and left ~125 ms of per-delta work for after the
last step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rillet.core.outputs import SeqDelta
from rillet.core.sequence import FinishReason
from rillet.http.openai.errors import ApiError

# Writes formatted during a routing pass, sent once the pass is over (see dispatcher.py):
# (the stream's writer, its bytes), in the order they were formatted.
Outbox = list[tuple[Callable[[bytes], None], bytes]]


class RequestStream:
    __slots__ = (
        "_waiter",
        "arrival",
        "ends",
        "engine_ids",
        "failure",
        "first_token_at",
        "flusher",
        "last_step",
        "last_token_at",
        "num_choices",
        "on_cut",
        "outbox",
        "pending",
        "pending_tokens",
        "request_id",
        "sink",
        "touched",
        "unfinished",
        "wake_tokens",
    )

    def __init__(self, request_id: str, num_choices: int, engine_ids: tuple[str, ...] = ()) -> None:
        self.request_id = request_id
        self.engine_ids = engine_ids or (request_id,)  # one engine request per prompt
        self.num_choices = num_choices
        self.pending: list[SeqDelta] = []
        self.pending_tokens = 0  # tokens in `pending`; bounded by stream.max_buffered_tokens
        self.unfinished = num_choices  # choices whose final delta has not arrived yet
        self.failure: ApiError | None = None  # set when the server cut this request off
        self.arrival = time.monotonic()
        self.first_token_at: float | None = None  # for TTFT / inter-token latency metrics
        self.last_token_at = 0.0
        self.last_step = -1  # engine step of the latest token (ITL: one observation per step)
        # each choice's final delta, as it came (its finish reason, error kind and engine timings:
        # the request's tracing span reads them at the end)
        self.ends: list[SeqDelta] = []
        self._waiter: asyncio.Future[None] | None = None
        self.touched = False  # the dispatcher's mark: pushed to during the current routing pass
        # wake the consumer once this many tokens are pending (or at the end); the server's consumers
        # use 1 (a non-streaming one has a sink, so nothing is ever pending for it)
        self.wake_tokens = 1
        # Set by a streaming writer while it may write directly; returns False when it cannot
        # (socket busy, stream ended, failure): then the consumer is woken instead.
        self.flusher: Callable[[], bool] | None = None
        # Set by the writer of a streaming response: called when the dispatcher cuts this request
        # off because its client fell too far behind (the writer may be stuck on a full socket).
        self.on_cut: Callable[[], None] | None = None
        # Set by a consumer that folds deltas as they come (non-streaming): push hands each delta
        # to it instead of keeping it pending. Must not raise (it runs inside the dispatcher).
        self.sink: Callable[[SeqDelta], None] | None = None
        # The dispatcher's outbox (set on register with stream.write_order after_release): a
        # flusher posts its writes there, and the dispatcher sends them after releasing the
        # engine. None: the flusher writes at once.
        self.outbox: Outbox | None = None

    def post(self, write: Callable[[bytes], None], data: bytes) -> None:
        """A direct write of this stream: queued in the outbox, or sent now without one."""
        outbox = self.outbox
        if outbox is None:
            write(data)
        else:
            outbox.append((write, data))

    @property
    def finished(self) -> bool:
        """Every choice has ended (or the request failed) and the consumer has taken all of it."""
        return (self.unfinished == 0 or self.failure is not None) and not self.pending

    @property
    def done_in_engine(self) -> bool:
        return self.unfinished == 0

    def push(self, delta: SeqDelta) -> None:
        if self.failure is not None:
            return
        sink = self.sink
        if sink is None:
            self.pending.append(delta)
            self.pending_tokens += len(delta.token_ids)
        else:
            sink(delta)
        reason = delta.finish_reason
        if reason is not None:
            self.ends.append(delta)
            # ERROR / ABORT end the request as a whole (the engine ends every choice with it).
            if reason is FinishReason.ERROR or reason is FinishReason.ABORT:
                self.unfinished = 0
            elif self.unfinished > 0:
                self.unfinished -= 1

    def deliver(self) -> None:
        """After a routing pass that pushed to this stream: write it out, or wake the consumer."""
        if self.failure is not None or self.unfinished == 0 or self.pending_tokens >= self.wake_tokens:
            flusher = self.flusher
            if flusher is None or not flusher():
                self._wake()

    def fail(self, error: ApiError) -> None:
        if self.failure is None:
            self.failure = error
        self._wake()

    def take(self) -> list[SeqDelta]:
        out = self.pending
        self.pending = []
        self.pending_tokens = 0
        return out

    async def wait(self) -> None:
        """Returns once something is pending or the request has ended."""
        if self.pending or self.failure is not None or self.unfinished == 0:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
