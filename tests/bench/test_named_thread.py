"""bench/lib/common.py's `named_thread`: the thread that named itself, not the ones it started."""

from __future__ import annotations

import os
import sys
import threading

import pytest
from rillet.core.thread_name import name_native_thread

from bench.lib.common import named_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OS thread names: Linux")


def test_the_namer_is_found_and_not_the_threads_it_starts() -> None:
    found: dict[str, int | None] = {}
    release = threading.Event()

    def child() -> None:
        release.wait(30)

    def namer() -> None:
        name_native_thread("bench-namer")
        started = threading.Thread(target=child)  # inherits the name from its creator
        started.start()
        found["namer"], found["child"] = threading.get_native_id(), started.native_id
        found["named"] = named_thread(os.getpid(), "bench-namer")
        release.set()
        started.join()

    t = threading.Thread(target=namer)
    t.start()
    t.join()
    assert found["named"] == found["namer"] != found["child"]
    assert named_thread(os.getpid(), "no-such-thread") is None
    assert named_thread(None) is None
