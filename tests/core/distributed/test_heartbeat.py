"""A worker's heartbeat (core/distributed/liveness.py): it bumps its counter in rank 0's store, and
`stop` ends its thread, so no daemon thread is inside a store call when the worker's interpreter
finalizes (rank 0 closes its store as its ranks stop: a call caught there aborted the worker)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from rillet.core.distributed import liveness
from rillet.core.distributed.liveness import Heartbeat, heartbeat_key
from torch._C._distributed_c10d import TCPStore


def _master() -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))


def _wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_it_bumps_its_counter_until_stopped() -> None:
    master = _master()
    hb = Heartbeat("127.0.0.1", master.port, 3, 0.01)
    key = heartbeat_key(3)
    _wait_for(lambda: bool(master.add(key, 0) >= 3))
    hb.stop()
    assert not hb._thread.is_alive()
    count = master.add(key, 0)
    time.sleep(0.1)  # ten intervals: a live thread would have bumped it
    assert master.add(key, 0) == count


def test_a_store_gone_while_stopping_ends_the_thread_not_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    exits: list[int] = []
    monkeypatch.setattr(liveness.os, "_exit", exits.append)
    master = _master()
    hb = Heartbeat("127.0.0.1", master.port, 1, 0.01)

    class Gone:
        def add(self, key: str, n: int) -> int:
            hb._stop.set()  # rank 0 closed its store as this worker was stopping
            raise RuntimeError("Connection reset by peer")

    hb.store = Gone()  # type: ignore[assignment]
    _wait_for(lambda: not hb._thread.is_alive())
    hb.stop()
    assert exits == []


def test_a_store_gone_while_running_ends_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    exits: list[int] = []
    master = _master()
    hb = Heartbeat("127.0.0.1", master.port, 2, 0.01)

    def exit_(code: int) -> None:
        exits.append(code)
        hb._stop.set()  # os._exit would not return: end the loop here

    class Gone:
        def add(self, key: str, n: int) -> int:
            raise RuntimeError("Connection reset by peer")

    monkeypatch.setattr(liveness.os, "_exit", exit_)
    hb.store = Gone()  # type: ignore[assignment]
    _wait_for(lambda: bool(exits))
    hb.stop()
    assert exits[0] == liveness.EXIT_RANK0_LOST
