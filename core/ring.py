"""A lock-free single-producer / single-consumer ring that carries engine steps to the event loop.

The engine thread is the only writer of `_head`, the consumer the only writer of `_tail`; slots
are preallocated. Under CPython a slot store followed by an int store is seen in that order by the
other thread (both happen under the GIL), so the consumer never reads a slot before it is filled,
and the producer never reuses a slot before the consumer has moved `_tail` past it.

Wake-ups: the consumer raises `_waiting` *before* its final emptiness check and sleeps; the
producer pushes *then* reads `_waiting`. Either the producer sees the flag, or the consumer sees
the item, so no wake-up is lost, and the producer clears the flag so one wait gets one wake-up:
at most one cross-thread notification per engine step, none while the consumer is busy.

Handoff (optional, for CPU serving): a consumer that promises to call `release()` once it has
*handled* what it popped (routed it, written it to sockets) says so with `set_notifier(...,
releases=True)`. The producer may then `wait_released()` before its next model run, so the
consumer's work happens between model runs instead of stealing cores from the model's threads.
Same flag-then-check pattern as the wake-up: the producer raises `_release_waiting` before its
last check of `_released`; the consumer stores `_released` before it reads the flag.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class RingClosed(Exception):
    """The consumer is gone: pushing would wait forever."""


class SpscRing(Generic[T]):
    def __init__(self, capacity: int) -> None:
        if capacity < 2 or capacity & (capacity - 1):
            raise ValueError(f"ring capacity must be a power of two >= 2, got {capacity}")
        self._buf: list[T | None] = [None] * capacity
        self._mask = capacity - 1
        self._capacity = capacity
        self._head = 0  # next slot to write; producer only
        self._tail = 0  # next slot to read; consumer only
        self._waiting = False  # consumer is (about to be) asleep
        self._notify: Callable[[], None] | None = None
        self._closed = False
        self._releases = False  # the consumer calls release() after handling what it popped
        self._released = 0  # items handled by the consumer; consumer only
        self._release_waiting = False  # producer is (about to be) blocked in wait_released
        self._release_event = threading.Event()
        self.wakeups = 0  # notifications sent (a counter for tests and metrics)
        self.full_waits = 0  # times the producer found the ring full
        self.release_timeouts = 0  # wait_released calls that gave up (the consumer lagged)
        self.release_wait_s = 0.0  # time spent blocked in wait_released (the engine's hand-off wait)

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return self._head - self._tail

    def set_notifier(self, notify: Callable[[], None] | None, releases: bool = False) -> None:
        """`notify` is called from the producer thread; it must be thread-safe and cheap.
        `releases`: this consumer calls `release()` after handling each batch it pops."""
        self._notify = notify
        self._releases = releases and notify is not None
        if not self._releases:
            self._release_event.set()  # a producer blocked in wait_released goes on

    @property
    def consumer_releases(self) -> bool:
        return self._releases

    def close(self) -> None:
        self._closed = True
        self._release_event.set()

    # ---- producer side ----------------------------------------------------------------------
    def try_push(self, item: T) -> bool:
        head = self._head
        if head - self._tail >= self._capacity:
            return False
        self._buf[head & self._mask] = item
        self._head = head + 1
        if self._waiting:
            self._waiting = False
            notify = self._notify
            if notify is not None:
                self.wakeups += 1
                notify()
        return True

    def push(self, item: T, timeout: float | None = None) -> None:
        """Blocks while the ring is full: a slow consumer slows the producer, never loses data."""
        if self.try_push(item):
            return
        self.full_waits += 1
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 1e-5
        while not self.try_push(item):
            if self._closed:
                raise RingClosed("ring closed while full")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("ring full")
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)

    def wait_released(self, timeout: float) -> bool:
        """Blocks until the consumer has released everything pushed so far (or `timeout` s pass,
        or it stops releasing). True when released; at once if the consumer does not release."""
        target = self._head
        if not self._releases or self._released >= target:
            return True
        start = time.monotonic()
        deadline = start + timeout
        event = self._release_event
        while True:
            event.clear()
            self._release_waiting = True
            if not self._releases or self._released >= target or self._closed:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                self.release_timeouts += 1
                break
            event.wait(left)  # a stale set() from an earlier wait only costs one more turn
        self._release_waiting = False
        self.release_wait_s += time.monotonic() - start
        return self._released >= target

    # ---- consumer side ----------------------------------------------------------------------
    def pop_all(self) -> list[T]:
        """Everything pushed so far, oldest first; frees the slots."""
        tail, head = self._tail, self._head
        if tail == head:
            return []
        buf, mask = self._buf, self._mask
        out: list[T] = []
        for i in range(tail, head):
            j = i & mask
            out.append(buf[j])  # type: ignore[arg-type]
            buf[j] = None
        self._tail = head
        return out

    def prepare_wait(self) -> bool:
        """Raise the waiting flag; returns False (and lowers it) if items arrived meanwhile."""
        self._waiting = True
        if self._head != self._tail:
            self._waiting = False
            return False
        return True

    def cancel_wait(self) -> None:
        self._waiting = False

    def release(self) -> None:
        """Everything popped so far has been handled: a producer in `wait_released` may go on."""
        self._released = self._tail
        if self._release_waiting:
            self._release_waiting = False
            self._release_event.set()
