"""A bounded queue of finished spans and the thread that exports them in batches, on the OpenTelemetry
batch processor's terms (OTEL_BSP_SCHEDULE_DELAY, OTEL_BSP_MAX_QUEUE_SIZE,
OTEL_BSP_MAX_EXPORT_BATCH_SIZE): it wakes when a full batch is queued or the delay has passed, and
`put` (the event loop's side) is a deque append that never blocks or waits on a lock."""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

_logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class BatchTerms:
    delay_s: float = 5.0
    max_queue: int = 2048
    max_batch: int = 512

    @staticmethod
    def from_env() -> BatchTerms:
        """The SDK's environment variables; a bad value is logged and its default kept, as the SDK does."""
        d = BatchTerms()
        delay_ms = _env_int("OTEL_BSP_SCHEDULE_DELAY", int(d.delay_s * 1000))
        queue = _env_int("OTEL_BSP_MAX_QUEUE_SIZE", d.max_queue)
        batch = _env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", d.max_batch)
        if batch > queue:
            _logger.warning("OTEL_BSP_MAX_EXPORT_BATCH_SIZE over the queue's size: using that")
            batch = queue
        return BatchTerms(delay_ms / 1000, queue, batch)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        _logger.warning("%s=%r is not a positive integer: using %d", name, raw, default)
        return default
    return value


class SpanBatcher(Generic[T]):
    """`export` runs on the batcher's own thread, one batch (at most `max_batch` items) a call."""

    def __init__(self, export: Callable[[Sequence[T]], None], terms: BatchTerms) -> None:
        self._export = export
        self._terms = terms
        self._queue: deque[T] = deque()
        self._wake = threading.Event()
        self._done = threading.Condition()  # guards the counters below
        self._asked = 0  # flushes asked for
        self._served = 0  # flushes done: every item queued before the ask was exported
        self._stopping = False
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="rillet-span-export", daemon=True)
        self._thread.start()

    def put(self, item: T) -> None:
        queue = self._queue
        if len(queue) >= self._terms.max_queue:
            if self.dropped == 0:
                _logger.warning("span queue full (%d): dropping spans", self._terms.max_queue)
            self.dropped += 1
            return
        queue.append(item)
        if len(queue) == self._terms.max_batch:
            self._wake.set()

    def flush(self, timeout_s: float) -> bool:
        """Waits until everything queued so far was exported; False if `timeout_s` passed first."""
        with self._done:
            self._asked += 1
            target = self._asked
        self._wake.set()
        with self._done:
            return self._done.wait_for(lambda: self._served >= target, timeout_s)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Exports what is queued and stops the thread."""
        with self._done:
            self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._terms.delay_s)
            self._wake.clear()
            with self._done:
                asked, stopping = self._asked, self._stopping
            self._drain()
            with self._done:
                self._served = asked
                self._done.notify_all()
            if stopping:
                return

    def _drain(self) -> None:
        queue, size = self._queue, self._terms.max_batch
        while queue:
            batch = [queue.popleft() for _ in range(min(size, len(queue)))]
            try:
                self._export(batch)
            except Exception:  # an exporter's bug must not end the thread: later spans still go
                _logger.exception("span export failed")
