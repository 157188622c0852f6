"""Knowing that the other ranks are alive, and never outliving rank 0.

Every worker rank runs a heartbeat thread that bumps a counter in rank 0's store; rank 0's
monitor (cluster.py) takes a rank whose counter stands still for parallel.liveness_timeout_s as
dead (a SIGSTOPped or wedged process stops its heartbeat too). The heartbeat also notices rank 0
going away (its store is gone) and ends the worker, so no rank is left behind on any host. A
worker that rank 0 started itself also asks the kernel for SIGKILL when its parent goes
(PR_SET_PDEATHSIG), which covers a rank 0 killed with SIGKILL before any heartbeat fails.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from datetime import timedelta

from rillet.core.distributed import parent_death
from torch._C._distributed_c10d import TCPStore

log = logging.getLogger(__name__)

EXIT_RANK0_LOST = 3  # a worker's exit code when rank 0 went away


def heartbeat_key(rank: int) -> str:
    return f"hb/{rank}"


def die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this process when the thread that started it ends; exit now if it has
    (elsewhere the heartbeat still ends us when rank 0 goes)."""
    parent_death.die_with_parent(parent_pid, EXIT_RANK0_LOST)


def store_client(addr: str, port: int, timeout_s: float) -> TCPStore:
    return TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=timeout_s))


class Heartbeat:
    """A worker's daemon thread: bump hb/<rank> every `interval_s`; if rank 0's store cannot be
    reached, end the process (rank 0 is gone, so is the point of this rank).

    `stop` before the worker exits: rank 0 closes its store once its ranks have stopped, and a
    daemon thread still inside a store call when the interpreter finalizes aborts the process
    (SIGABRT from C++, "terminate called without an active exception") instead of exiting 0."""

    def __init__(self, addr: str, port: int, rank: int, interval_s: float) -> None:
        self.timeout_s = max(5.0, 4 * interval_s)
        self.store = store_client(addr, port, self.timeout_s)
        self.key, self.interval_s = heartbeat_key(rank), interval_s
        self.store.add(self.key, 1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rillet-heartbeat-{rank}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.store.add(self.key, 1)
            except Exception as exc:  # the store lives in rank 0: it is gone
                if self._stop.is_set():  # the worker is ending anyway: rank 0 may close first
                    return
                log.error("rank 0 is unreachable (%s): exiting", exc)
                os._exit(EXIT_RANK0_LOST)

    def stop(self) -> None:
        """Ends the thread (waits out a store call in flight, at most its timeout)."""
        self._stop.set()
        self._thread.join(self.timeout_s + self.interval_s)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Staleness:
    """Rank 0's view of the heartbeat counters: which rank has not bumped its own for too long."""

    def __init__(self, ranks: list[int], timeout_s: float) -> None:
        now = time.monotonic()
        self.timeout_s = timeout_s
        self.seen: dict[int, tuple[int, float]] = {r: (-1, now) for r in ranks}

    def update(self, rank: int, count: int) -> float:
        """Records `count` for `rank`; returns the seconds since its counter last moved."""
        last, since = self.seen[rank]
        now = time.monotonic()
        if count != last:
            self.seen[rank] = (count, now)
            return 0.0
        return now - since
