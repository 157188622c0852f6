"""The extension build guard (core/quant/build_lock.py): a lock left by a killed build never hangs
the next start, and a build in progress in another process is waited for."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rillet.core.quant.build_lock import GUARD, TORCH_LOCK, exclusive_build

# A process that takes the guard, makes torch's lock as a build does, and waits to be killed.
_HOLDER = """
import fcntl, os, sys, time
d = sys.argv[1]
fd = os.open(os.path.join(d, "rillet.flock"), os.O_CREAT | os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
os.close(os.open(os.path.join(d, "lock"), os.O_CREAT | os.O_EXCL))
print("held", flush=True)
time.sleep(600)
"""


def test_a_torch_lock_found_under_the_guard_is_removed_however_fresh(tmp_path: Path) -> None:
    """No rillet process holds the guard, so nobody is building: the lock is a leftover (before,
    only a lock older than 10 minutes was, and a restart within them hung)."""
    (tmp_path / TORCH_LOCK).touch()
    with exclusive_build(tmp_path):
        assert not (tmp_path / TORCH_LOCK).exists()
    with exclusive_build(tmp_path / "new"):  # a build folder that does not exist yet
        assert (tmp_path / "new" / GUARD).exists()


def test_a_build_in_another_process_is_waited_for_until_its_process_dies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cmd = [sys.executable, "-c", _HOLDER, str(tmp_path)]
    holder = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert (tmp_path / TORCH_LOCK).exists()
        entered = threading.Event()
        lock_seen: list[bool] = []

        def build() -> None:
            with exclusive_build(tmp_path):
                lock_seen.append((tmp_path / TORCH_LOCK).exists())
                entered.set()

        caplog.set_level(logging.INFO, logger="rillet.core.quant.build_lock")
        thread = threading.Thread(target=build, daemon=True)
        thread.start()
        assert not entered.wait(0.5)  # the other build holds the guard
        assert any("waiting for another process's build" in r.getMessage() for r in caplog.records)
        holder.kill()  # killed mid-build: its torch lock stays behind, its flock does not
        holder.wait()
        assert entered.wait(30)
        thread.join(30)
        assert lock_seen == [False]  # the killed build's lock, removed before the body ran
    finally:
        holder.kill()
        holder.wait()
