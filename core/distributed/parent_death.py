"""Never outliving the process that started us: a tensor-parallel worker rank (liveness.py) and
the server's compile process (core/compile_process.py). Without it, a server killed with SIGKILL
or by its own second signal (os._exit) left its child compiling at nice 19, and the restarted
server started another for the same steps. No torch here: the compile child arms this before it
imports torch."""

from __future__ import annotations

import ctypes
import logging
import os
import signal

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, exit_code: int) -> None:
    """Linux: SIGKILL this process when the thread that started it ends; exit with `exit_code`
    now if it has already (the signal is armed too late for a parent gone before this call)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        log.debug("PR_SET_PDEATHSIG unavailable")
    if os.getppid() != parent_pid:
        os._exit(exit_code)
