"""Where the repository is, for tests that run its commands or read its files (tests/support/ is
on pytest's pythonpath: pyproject.toml)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
BENCH_OUT = BENCH / "out"
