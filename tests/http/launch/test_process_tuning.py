"""Serving-process settings: the loop thread's lower priority touches that thread only."""

from __future__ import annotations

import gc
import os
import sys
import threading

import pytest
from rillet.core.config import ConfigError, config_from_dict
from rillet.http.launch.process_tuning import freeze_heap, lower_thread_priority


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux behaviour")
def test_lower_thread_priority_renices_the_calling_thread_only() -> None:
    main_before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: dict[str, int | bool] = {}

    def worker() -> None:
        tid = threading.get_native_id()
        before = os.getpriority(os.PRIO_PROCESS, tid)
        seen["ok"] = lower_thread_priority(3)
        seen["delta"] = os.getpriority(os.PRIO_PROCESS, tid) - before

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"ok": True, "delta": 3} or seen["delta"] == 19 - main_before
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_before
    assert lower_thread_priority(0) is False


def test_freeze_heap_moves_live_objects_out_of_collections() -> None:
    try:
        assert freeze_heap() > 1000
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("value", [-1, 20])
def test_loop_nice_is_validated(value: int) -> None:
    with pytest.raises(ConfigError, match=r"server\.loop_nice"):
        config_from_dict({"server": {"loop_nice": value}})
