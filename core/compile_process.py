"""A child process that builds the missing saved steps of the server's config (graphs/aot/).

The server starts it when a compiled step it looks up is not on disk, and serves eager meanwhile.
A process, not a thread: a compile in a thread holds this process's GIL for seconds at a time
(tracing, Inductor's lowering) and requests waited up to 1.4-1.9 s behind it; in a child it holds
the child's. The child sets its own nice value to 19 before it imports torch, so its OpenMP
threads and the compiler processes Inductor forks run only on what the server leaves of the cores.
It loads the model from the same config (the same weights, hence the same keys), builds what is
missing, saves it, and exits; the server then loads the artifacts (graphs/aot/artifact_steps.py).

Its standard error (Inductor's warnings and autotuning tables, a traceback) goes to a log file
beside the artifacts (`build.log`); its progress lines (standard output) are logged here.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from rillet.core.config import RilletConfig, config_to_dict

log = logging.getLogger(__name__)

CHILD_NICE = 19


class CompileProcess:
    """graphs/aot/saved.py's Builder: `build` runs the child to its end (on the compile thread)."""

    def __init__(self, cfg: RilletConfig, threads: int, logfile: Path) -> None:
        self.cfg = cfg
        self.threads = threads  # the server's: the child compiles for it (the code bakes it in)
        self.logfile = logfile  # the child's standard error
        self._proc: subprocess.Popen[str] | None = None
        self._cancelled = threading.Event()
        self._lock = threading.Lock()

    def build(self, graphs: Sequence[str]) -> None:
        logfile = self.logfile
        logfile.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "rillet.core.compile_ahead", "--child"]
        cmd += ["--threads", str(self.threads), "--nice", str(CHILD_NICE), "--steps", ",".join(graphs)]
        cmd += ["--parent", str(os.getpid())]  # the child ends with this process (SIGKILL included)
        with logfile.open("w") as err, self._lock:
            if self._cancelled.is_set():
                return
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
            )
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        log.info("compile process %d: building %s (log: %s)", proc.pid, ", ".join(graphs), logfile)
        proc.stdin.write(json.dumps(config_to_dict(self.cfg)))
        proc.stdin.close()
        for line in proc.stdout:
            log.info("compile process %d: %s", proc.pid, line.rstrip())
        code = proc.wait()
        if code != 0 and not self._cancelled.is_set():
            raise RuntimeError(f"the compile process exited with status {code}: {_tail(logfile)}")

    def cancel(self) -> None:
        """Ends the child at once (the server is closing); a half-built artifact is never saved:
        the child moves only finished packages into place."""
        with self._lock:
            self._cancelled.set()
            if self._proc is not None and self._proc.poll() is None:
                self._proc.terminate()


def _tail(path: os.PathLike[str]) -> str:
    try:
        with open(path) as f:
            lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"
