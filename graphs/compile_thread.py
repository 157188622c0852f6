"""The compile thread's manners (graphs/compiled.py): a lower priority, a shorter GIL switch
interval while it runs, one-line error summaries, and Inductor's cache-hit count."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)

COMPILE_NICE = 10  # added to the compile thread's nice value: the engine thread's steps come first
# The interpreter's GIL switch interval while a compile runs (default 5 ms). Dynamo and Inductor
# hold the GIL in pure Python for seconds; the engine thread gives it up in every torch op, and
# each time waited up to the interval to get it back: 1-token requests took up to 12.3 s during a
# cold compile of the default model (measured), at 0.5 ms up to 1-2 s. Restored when it ends.
COMPILE_SWITCH_INTERVAL_S = 0.0005


def summary(exc: Exception) -> str:
    """An error as one log-sized line: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


@contextmanager
def gil_switch_interval(seconds: float | None) -> Iterator[None]:
    """sys.setswitchinterval for the duration (process-wide: restored unless changed meanwhile)."""
    if seconds is None:
        yield
        return
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        if sys.getswitchinterval() == seconds:
            sys.setswitchinterval(before)


def lower_this_threads_priority() -> None:
    """Nice the calling thread (Linux: nice is per thread; the OpenMP workers it starts and the
    compiler processes Inductor forks inherit it), so that a cold compile (about a minute of
    C++ on 2 cores) does not delay the steps that serve meanwhile: the first token included."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + COMPILE_NICE))
    except (AttributeError, OSError) as exc:  # not Linux, or not allowed: compile at normal priority
        logger.debug("compile thread keeps its priority: %s", exc)


def cache_hits() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_hit"])
