"""Process settings for serving, applied once the engine is loaded, before it starts.

- The heap is frozen (`gc.freeze`): the model, the tokenizer's tables and everything else built
  at load time live as long as the process, and a full collection would walk all of them. Frozen,
  they are skipped; collections only see request-time objects (shorter pauses on both threads).
- At start-up (`raise_fd_limit`), the soft limit on open files is raised to the hard limit: every
  client connection holds a descriptor, and the default soft limit (often 1,024) would cap the
  server far below what the machine allows. The connection cap (http/net/conn_limits.py) is then
  sized to fit what the limit leaves.
- Optionally (`server.loop_nice` > 0) the event loop's thread gets a lower CPU priority, so that
  when engine thread and loop are both runnable the engine wins. Linux only: there `setpriority`
  on a thread id renices that thread alone; raising nice needs no privileges. Off by default, on
  measurement (bench/RESULTS.md): with the null engine (a GIL-light engine thread) nice 5 made
  256 streams ~7 % faster, but with torch's two OpenMP threads on two cores it cost ~10 % at 8
  streams — priority inversion: the niced loop, starved by the OpenMP threads while it holds the
  GIL, holds up the engine thread's next op dispatch.
"""

from __future__ import annotations

import gc
import logging
import os
import resource
import sys
import threading

log = logging.getLogger(__name__)


def freeze_heap() -> int:
    """Collects once, then moves every live object out of the collector's reach; returns how many."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def lower_thread_priority(nice: int) -> bool:
    """Adds `nice` to the calling thread's nice value; False where that is not possible."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as exc:
        log.warning("could not lower the event loop's priority: %s", exc)
        return False
    return True


def raise_fd_limit() -> tuple[int, int]:
    """Raises the soft RLIMIT_NOFILE to the hard one; logs both; returns (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = soft
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError) as exc:  # e.g. an unlimited hard limit the kernel refuses
            log.warning("could not raise the open files limit from %d to %d: %s", soft, hard, exc)
    log.info("open files limit: soft %s (was %s), hard %s", _limit(soft), _limit(before), _limit(hard))
    return soft, hard


def _limit(n: int) -> str:
    return "unlimited" if n == resource.RLIM_INFINITY else str(n)


def tune_for_serving(loop_nice: int) -> None:
    """Call on the event loop's thread."""
    frozen = freeze_heap()
    niced = lower_thread_priority(loop_nice)
    log.info(
        "heap frozen (%d objects); event loop thread %s",
        frozen,
        f"at nice +{loop_nice}" if niced else "at normal priority",
    )
