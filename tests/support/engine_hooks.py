"""Hooks into a running engine that make a test's timing deterministic (imported by name).

A test must not depend on how fast this machine runs the engine against its clients: instead of
hoping that N requests arrive before the first step, or that a client disconnects before its
request ends, it holds the engine's model step until the condition holds. The hooks wrap
`engine.core.runner.launch`, which the engine thread calls once per step after publishing the
previous step's output (so a held step never withholds tokens already landed).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def scheduled_batches(engine: Any) -> Iterator[list[set[str]]]:
    """The request ids of every batch the engine's scheduler forms while inside (its steps' order)."""
    sched = engine.core.scheduler
    schedule = sched.schedule
    batches: list[set[str]] = []

    def spy() -> Any:
        batch = schedule()
        batches.append({s.request_id for s in batch.seqs})
        return batch

    sched.schedule = spy
    try:
        yield batches
    finally:
        del sched.schedule


def count_calls(obj: Any, name: str) -> Callable[[], int]:
    """Wraps method `name` of `obj` (an instance attribute shadows the class one); returns a reader."""
    calls = [0]
    inner = getattr(obj, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return inner(*args, **kwargs)

    setattr(obj, name, wrapped)
    return lambda: calls[0]


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:  # a hang bound only: the test then fails on its own terms
            raise AssertionError(f"engine held {timeout:.0f} s waiting for {what}")
        time.sleep(0.002)


@contextmanager
def hold_steps(
    engine: Any,
    until: Callable[[Any], bool],
    when: Callable[[Any], bool] | None = None,
    timeout: float = 60.0,
) -> Iterator[threading.Event]:
    """Every model step for which `when(batch)` is true (default: every step) waits, on the engine
    thread, until `until(batch)` is true. Yields an Event that is set once a step is being held
    (the engine thread is then parked inside that step). The engine's own step is back afterwards.

    A hold that times out raises in the engine thread (the step fails its batch): never a silent
    pass on a machine too slow for the test's premise."""
    runner = engine.core.runner
    inner = runner.launch
    holding = threading.Event()

    def held(batch: Any) -> Any:
        if (when is None or when(batch)) and not until(batch):
            holding.set()
            _wait(lambda: until(batch), timeout, "the test's condition")
        return inner(batch)

    runner.launch = held
    try:
        yield holding
    finally:
        runner.launch = inner


def hold_first_step(engine: Any, requests: int, timeout: float = 60.0) -> None:
    """The engine's first model step waits until `requests` requests have been added, so the next
    step admits them together, whatever the speed of this machine and of the clients."""
    inner = engine.core.runner.launch
    held = [False]

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not held[0]:
            held[0] = True
            _wait(lambda: engine._inbox.added >= requests, timeout, f"{requests} requests")
        return inner(*args, **kwargs)

    engine.core.runner.launch = wrapped


def fail_postprocessing(engine: Any, request_ids: list[str]) -> None:
    """On the engine thread: every live choice of these requests raises when its next token is
    detokenized, so post-processing fails for them alone (the engine must go on)."""

    def broken(token_id: int, num_output_tokens: int) -> Any:
        raise RuntimeError("injected fault")

    core = engine.core
    for rid in request_ids:
        for seq in core.seqs.get(rid, []):
            core._detok[seq.seq_id].add = broken
