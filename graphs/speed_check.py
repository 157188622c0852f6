"""`graphs.enabled: auto`'s check of the compiled CPU decode step against eager (SpeedCheck, a
part of CompiledDecode: graphs/compiled.py).

Under `graphs.enabled: auto` the compiled step is kept only if it measures no slower than eager,
and that measurement runs on the model's own thread (`poll()`, called by the engine between
steps) once the compile thread has ended, never on the compile thread: torch's OpenMP pool
belongs to the thread that built the model, and a forward on any other thread ran 2.3x slower
(measured: 19-21 ms vs 8.2 ms at batch 2, eager), enough to time the tuned step below as slower
than eager (25.5 vs 22.9 ms) when on the engine thread it is 1.7x faster.

Apart from the compile itself: this runs on another thread, at another time (after it), and
decides only whether what was compiled is used.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time

import torch
from rillet.graphs.compile_modes import DecodeFn
from rillet.graphs.compile_thread import summary
from rillet.graphs.interface import DecodeBatch, DecodeModel

logger = logging.getLogger(__name__)

CHECK_RUNS = 7  # timed calls of each path for `graphs.enabled: auto`, interleaved
# auto keeps the compiled step unless it measures this much slower than eager: the check runs
# between two engine steps of a live server (the host's other threads busy), which can slow
# either path by 30 % for a moment; compiled measured 1.2-1.7x faster on every CPU model tried
SLOWER_THAN_EAGER = 1.10


class SpeedCheck:
    """CompiledDecode's timing against eager; see the module docstring."""

    # CompiledDecode's state that the check reads and writes (set in its __init__)
    model: DecodeModel
    fn: DecodeFn
    with_batch_1: bool
    ready: bool
    ready_1: bool
    settled: bool
    failed: str | None
    _check_due: bool
    _check_batch: DecodeBatch | None
    _thread: threading.Thread | None
    _done: threading.Event

    def poll(self) -> None:
        """On the model's own thread, between steps (the engine calls it, idle or not): under
        `graphs.enabled: auto`, once the compile thread has ended, time the compiled step against
        eager here and switch to it if it is no slower. Otherwise nothing (an attribute read)."""
        if not self._check_due or (self._thread is not None and self._thread.is_alive()):
            return
        self._check_due = False
        self._decide()

    def _decide(self) -> None:
        """graphs.enabled auto, on the model's thread: keep the compiled step if it is no slower."""
        assert self._check_batch is not None
        try:
            with torch.inference_mode():
                keep = self._faster(self._check_batch)
        except Exception as exc:  # the compiled step failed to run: stay eager
            self.failed = summary(exc)
            logger.warning("compiled decode off, serving eager: the compiled step failed (%s)", self.failed)
            keep = False
        if keep:
            self.ready_1 = self.with_batch_1  # before `ready`: the engine reads them in that order
            self.ready = True
            self.settled = True
        self._done.set()

    def _faster(self, batch: DecodeBatch) -> bool:
        """graphs.enabled auto: time both paths on the same small batch, interleaved; keep the
        compiled step unless its median is clearly slower (SLOWER_THAN_EAGER)."""
        eager: list[float] = []
        compiled: list[float] = []
        for _ in range(CHECK_RUNS):
            for fn, times in ((self.model.forward_decode, eager), (self.fn, compiled)):
                self.model.prepare_decode(batch)
                t0 = time.perf_counter()
                fn(batch)
                times.append(time.perf_counter() - t0)
        e, c = statistics.median(eager) * 1e3, statistics.median(compiled) * 1e3
        if c <= e * SLOWER_THAN_EAGER:
            logger.info("decode step: compiled %.2f vs eager %.2f ms a step (batch 2): compiled in use", c, e)
            return True
        self.failed = f"compiled {c:.2f} ms vs eager {e:.2f} ms per step (batch 2): slower"
        logger.info("decode step stays eager: %s", self.failed)
        return False
