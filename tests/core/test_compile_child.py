"""The server's compile process (core/compile_process.py) never outlives the server: killed with
SIGKILL (or by its second signal's os._exit), the server took nothing down with it, and its child
went on compiling at nice 19 beside the restarted server's own compile of the same steps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rillet.core.compile_ahead import EXIT_PARENT_GONE

# A stand-in server: starts the compile child as CompileProcess does (its pid as --parent), with
# the standard input this test holds open, prints the child's pid and waits to be killed.
_SERVER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-m", "rillet.core.compile_ahead", "--child", "--threads",
                          "1", "--nice", "1", "--parent", str(os.getpid())])
print(child.pid, flush=True)
time.sleep(120)
"""


def _nice(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[16])  # field 19 of stat; [0] here is field 3


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_the_compile_child_dies_with_a_killed_server() -> None:
    read, write = os.pipe()  # the child's stdin: never closed before the end, so it waits on it
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=read, stdout=subprocess.PIPE, text=True)
    os.close(read)
    child = 0
    try:
        assert server.stdout is not None
        child = int(server.stdout.readline())
        deadline = time.monotonic() + 60
        while _nice(child) != 1:  # it renices itself once armed, just before it reads its config
            assert time.monotonic() < deadline and not _gone(child), "the child never got going"
            time.sleep(0.02)
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        deadline = time.monotonic() + 10
        while not _gone(child):
            assert time.monotonic() < deadline, "the compile child outlived its server"
            time.sleep(0.02)
    finally:
        os.close(write)
        server.kill()
        if child and not _gone(child):
            os.kill(child, signal.SIGKILL)


def test_a_child_whose_server_is_already_gone_exits_at_once() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    read, write = os.pipe()
    try:
        cmd = [sys.executable, "-m", "rillet.core.compile_ahead", "--child", "--threads", "1"]
        done = subprocess.run([*cmd, "--parent", str(gone.pid)], stdin=read, timeout=60, check=False)
        assert done.returncode == EXIT_PARENT_GONE  # without reading its config (stdin stays open)
    finally:
        os.close(read)
        os.close(write)
