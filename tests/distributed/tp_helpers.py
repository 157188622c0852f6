"""Helpers of the tensor-parallel tests: tiny model settings, process trees, `rillet` subprocesses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RILLET = Path(sys.executable).with_name("rillet")

# 8 query heads over 4 KV heads: TP=2 gives each rank 4 query heads and 2 KV heads
TINY_TP: dict[str, Any] = {"num_attention_heads": 8, "num_key_value_heads": 4}
# One thread per rank (2 cores), a small pool and token budget: preemption and chunked prefill
TP_TEST_SETS = ["model.num_threads=1", "parallel.liveness_timeout_s=3", "parallel.timeout_s=30"]


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children, their children, ...), from /proc."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in found]
        found.update(kids)
        frontier.extend(kids)
    return found


def alive(pid: int) -> bool:
    """True for a running process (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def assert_all_gone(pids: set[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = {p: Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")[:120] for p in pids if alive(p)}
    assert not left, f"processes left behind: {left}"


class Rillet:
    """`rillet <command> ...` as a subprocess; stderr collected on a thread."""

    def __init__(self, command: str, *sets: str, env: dict[str, str] | None = None) -> None:
        args = [str(RILLET), command]
        if command == "serve":
            args += ["--port", "0"]
        for s in sets:
            args += ["--set", s]
        self.proc = subprocess.Popen(
            args, stderr=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, **(env or {})}
        )
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self.host, self.port = "127.0.0.1", 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            self.lines.append(line)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def wait_for_line(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, self.log
            assert time.monotonic() < deadline, self.log
            time.sleep(0.05)

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
