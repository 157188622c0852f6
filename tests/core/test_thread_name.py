"""core/thread_name.py: a thread's name where the OS shows it."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from rillet.core.thread_name import MAX_BYTES, name_native_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OS thread names: Linux")


def _comm(tid: int) -> str:
    return Path(f"/proc/self/task/{tid}/comm").read_text().strip()


def test_a_thread_names_itself_and_no_other_cut_to_the_kernels_length() -> None:
    main = _comm(threading.get_native_id())
    seen: dict[str, object] = {}

    def run() -> None:
        seen["ok"] = name_native_thread("rillet-a-long-thread-name")
        seen["comm"] = _comm(threading.get_native_id())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == {"ok": True, "comm": "rillet-a-long-thread-name"[:MAX_BYTES]}
    assert _comm(threading.get_native_id()) == main
