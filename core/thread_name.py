"""The calling thread's name where the OS shows it: `top -H`, `ps -L`, /proc/<pid>/task/<tid>/comm,
perf and py-spy's native frames. Python's own thread names stay inside the interpreter, so without
this every thread of the server reads "python" there, and the engine thread cannot be told from the
event loop or torch's workers (bench/lib/timed_batch.py reads the engine thread's CPU by this name).

Linux only (prctl PR_SET_NAME, 15 bytes); elsewhere, and where libc will not say, nothing happens.
Threads the named thread starts later inherit the name (the engine thread's OpenMP workers and its
compile thread read "rillet-engine" too); the one that named itself has the lowest id of them.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

PR_SET_NAME = 15
MAX_BYTES = 15  # the kernel's TASK_COMM_LEN less its NUL


def name_native_thread(name: str) -> bool:
    """Names the calling thread for the OS (cut to 15 bytes); True if the OS took it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        ok = prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:MAX_BYTES]), 0, 0, 0) == 0
    except (OSError, AttributeError) as exc:  # no libc symbols to call: keep the default name
        log.debug("thread %s keeps its OS name: %s", name, exc)
        return False
    return bool(ok)
