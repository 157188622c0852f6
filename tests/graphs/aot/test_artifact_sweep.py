"""Folders a killed build leaves under the compiled-step store are deleted by the next build
(graphs/aot/store.py `sweep`): those of processes that are gone, never a live one's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rillet.graphs.aot.store import UNNAMED_BUILD_AGE_S, ArtifactStore


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _folder(root: Path, name: str, age_s: float = 0.0) -> Path:
    path = root / name
    path.mkdir()
    (path / "step.so").write_bytes(b"\0" * 64)  # a partial library
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def test_the_folders_of_gone_builds_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    dead, me = _dead_pid(), os.getpid()
    gone = [
        _folder(tmp_path, f".build-{dead}-1a2b3c4d"),
        _folder(tmp_path, f".decode.{dead}.1a2b3c4d.tmp"),
        _folder(tmp_path, ".build-se6_j0jt", age_s=UNNAMED_BUILD_AGE_S + 60),  # no pid, old
    ]
    kept = [
        _folder(tmp_path, f".build-{me}-1a2b3c4d"),
        _folder(tmp_path, f".decode.{me}.1a2b3c4d.tmp"),
        _folder(tmp_path, ".build-y9j_ejz5"),  # no pid, recent: maybe an older rillet's live build
        _folder(tmp_path, ".elsewhere"),
        _folder(tmp_path, "decode-6c2f74c5bfe01d1bfb23"),  # an artifact
    ]
    swept = ArtifactStore(tmp_path).sweep()
    assert sorted(swept) == sorted(gone)
    assert not any(p.exists() for p in gone) and all(p.exists() for p in kept)


def test_a_build_folder_is_named_for_its_process_and_sweeps_first(tmp_path: Path) -> None:
    stale = _folder(tmp_path, f".build-{_dead_pid()}-00000000")
    store = ArtifactStore(tmp_path)
    fresh = store.build_dir()
    assert fresh.name.startswith(f".build-{os.getpid()}-") and fresh.is_dir()
    assert not stale.exists()
    assert store.sweep() == []  # this process's own folder is alive
