"""Helpers of the tensor-parallel tests: tiny model settings, process trees, `rillet` subprocesses."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from proc_helpers import RilletProcess

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


Rillet = RilletProcess  # `rillet serve` / `rillet worker` with the sets a test gives
