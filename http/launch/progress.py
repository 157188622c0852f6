"""The loading progress bar of `rillet serve` (the engine's `progress(stage, fraction)` callback).

Called from the loading thread. On a terminal it redraws one line; otherwise (logs, CI) it writes
a line per stage and per quarter, so a log file shows progress without a wall of carriage returns.
"""

from __future__ import annotations

import threading
import time
from typing import TextIO

_WIDTH = 28


class ProgressBar:
    def __init__(self, out: TextIO, label: str = "loading") -> None:
        self._out = out
        self._label = label
        self._tty = out.isatty()
        self._lock = threading.Lock()
        self._stage = ""
        self._quarter = -1
        self._start = time.monotonic()
        self._open_line = False

    def __call__(self, stage: str, fraction: float) -> None:
        fraction = min(max(fraction, 0.0), 1.0)
        with self._lock:
            if self._tty:
                self._draw(stage, fraction)
            else:
                self._log(stage, fraction)
            self._stage = stage

    def close(self) -> None:
        with self._lock:
            if self._open_line:
                self._out.write("\n")
                self._out.flush()
                self._open_line = False

    def _draw(self, stage: str, fraction: float) -> None:
        filled = int(fraction * _WIDTH)
        bar = "#" * filled + "." * (_WIDTH - filled)
        elapsed = time.monotonic() - self._start
        line = f"\r{self._label} [{bar}] {fraction * 100:5.1f}%  {elapsed:5.1f}s  {stage:<24}"
        self._out.write(line)
        self._open_line = True
        if fraction >= 1.0 and stage == "ready":
            self._out.write("\n")
            self._open_line = False
        self._out.flush()

    def _log(self, stage: str, fraction: float) -> None:
        quarter = int(fraction * 4)
        if stage == self._stage and quarter == self._quarter:
            return
        self._quarter = quarter
        elapsed = time.monotonic() - self._start
        self._out.write(f"{self._label}: {stage} {fraction * 100:.0f}% ({elapsed:.1f}s)\n")
        self._out.flush()
