"""The engine thread's host work first: the event loop steps aside while the engine prepares a step.

With asynchronous launches (CUDA; the asynchronous null engine) the engine thread alternates
between waiting for the device, with the GIL released, and host work on the GIL: landing step N,
then scheduling and launching N+2, which must be queued before the device finishes N+1 or the
device waits for it. The event loop's work on a step's output (routing, SSE frames, socket writes:
~10 us a streamed token) is published as the engine starts to wait, so it runs while the device
works. At 64 streams a loop burst can outlast that wait, and then the engine's host work shares
the GIL with it. Measured on an H200 with the 7B shape at 64 streams (bench/RESULTS.md): the
engine's host time a step grew by 0.7-1.0 ms when streaming; up to 22 % of the launches finished
after the device had finished the step before (5 % non-streamed); steps took 3-4 % longer.

The gate (`stream.engine_first: on`) gives the engine priority. The loop calls `give_way()`
between its writes. It parks (the GIL released) while the engine does host work, and while the
engine waits for a step that is about to end (the probe: the engine is about to wake), until the
engine starts its next wait, or for at most `max_park_s`. That bound covers the moments when the
engine blocks outside a device wait (a full ring) and so is neither working nor waiting.
`stream.engine_first_probe` says how the loop knows a step is about to end:
  device  the step's own completion (a CUDA event query from the loop's thread);
  clock   the engine's forecast: the last step's landing plus the period between landings, less a
          margin (no device call from the loop);
  none    not at all: the loop gives way only once the engine has taken the GIL back.
On the asynchronous null engine (a 2-core VM, 256 streams, 1.5 ms of host work a step) every probe
took the engine's streamed host time back to its non-streamed level and streamed / non-streamed
from 0.948 to 0.970-0.977 (none the cheapest: no device call from the loop, the default). Off by
default all the same: on the H200, with the device probe, 64 streams went from 0.955 to 0.980, but
both modes ran 2-5 % slower in absolute terms in that run (bench/RESULTS.md), and the other
probes have not run there yet (bench/gpu/GPU.md: `--d-gate off device clock none`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rillet.core.config import StreamConfig

Probe = Callable[[], bool]  # True once the step the engine waits for is (about to be) done
CLOCK_MARGIN_S = 0.0002  # the clock probe says "done" this long before the forecast end
PERIOD_WEIGHT = 0.2  # of the newest landing-to-landing period in the clock probe's average


class EngineGate:
    """Written by the engine thread (`waiting` / `working`), read by the loop; `open()` from any."""

    __slots__ = (
        "_awaited",
        "_cond",
        "_landed_at",
        "_open",
        "_period",
        "_probe",
        "_waiting",
        "_waits",
        "max_park_s",
        "parked_s",
        "parks",
        "probe_mode",
    )

    def __init__(self, max_park_s: float = 0.005, probe_mode: str = "none") -> None:
        self._cond = threading.Condition(threading.Lock())
        self._waiting = True  # until the engine's first step: nothing to give way to
        self._probe: Probe | None = None
        self._awaited: Probe | None = None  # the step_ready of the wait under way
        self._waits = 0  # how many waits the engine has begun (the loop parks until the next one)
        self._open = False  # for good (the engine stopped): never park again
        self._landed_at = 0.0  # clock probe: when the last device wait ended
        self._period = 0.0  # ... and the average time between two of them (0: none yet)
        self.max_park_s = max_park_s
        self.probe_mode = probe_mode
        self.parks = 0  # the loop's
        self.parked_s = 0.0

    # ---- the engine thread ---------------------------------------------------------------------
    def waiting(self, step_ready: Probe | None = None) -> None:
        """Just before the engine blocks on the device (`step_ready`: the step's completion) or
        idles (None): the loop may run. Again for the step already announced (the engine marks
        itself waiting at the publish and again as it lands): nothing, so a loop parked until the
        engine's next wait stays parked until the next one in truth."""
        if self._waiting and step_ready is not None and step_ready == self._awaited:
            return
        probe = None
        if step_ready is not None:
            if self.probe_mode == "device":
                probe = step_ready
            elif self.probe_mode == "clock" and self._period > 0:
                due = self._landed_at + self._period - CLOCK_MARGIN_S
                probe = lambda: time.perf_counter() >= due  # noqa: E731
        with self._cond:
            self._probe, self._awaited = probe, step_ready
            self._waiting = True
            self._waits += 1
            self._cond.notify_all()

    def working(self, landed: bool = False) -> None:
        """The engine holds the GIL again for its host work (`landed`: after a device wait): the
        loop gives way at its next look."""
        self._waiting = False
        self._probe = self._awaited = None
        if landed:
            now = time.perf_counter()
            if self._landed_at:
                gap = now - self._landed_at
                self._period = (
                    gap if not self._period else self._period + PERIOD_WEIGHT * (gap - self._period)
                )
            self._landed_at = now
        else:  # an idle engine: the next landing starts a new period
            self._landed_at = 0.0

    def open(self) -> None:
        """The engine has stopped: the loop never parks again."""
        with self._cond:
            self._open = True
            self._cond.notify_all()

    # ---- the event loop's thread ---------------------------------------------------------------
    def give_way(self) -> bool:
        """Between two pieces of the loop's work: parks (the GIL released) while the engine does
        host work, until its next wait begins or for at most max_park_s. True if it parked."""
        seen = self._waits  # read first: a wait begun after this ends the park at once
        if self._waiting:
            probe = self._probe
            if probe is None or not probe():
                return False
        elif self._open:
            return False
        t0 = time.perf_counter()
        with self._cond:
            self._cond.wait_for(lambda: self._open or self._waits != seen, self.max_park_s)
        self.parks += 1
        self.parked_s += time.perf_counter() - t0
        return True


def resolve_gate(cfg: StreamConfig, async_launch: bool, hands_off: bool) -> tuple[EngineGate | None, str]:
    """stream.engine_first -> (the gate or None, why), for the start-up log."""
    if cfg.engine_first == "off":
        return None, "off (stream.engine_first: off)"
    if not async_launch:
        return None, "off (a launch runs the model on the engine thread: no device wait to run in)"
    if hands_off:  # the engine waits for the loop before a model run: the loop must never wait back
        return None, "off (stream.handoff is on: the engine waits for the event loop)"
    gate = EngineGate(cfg.engine_first_max_park_ms / 1000, cfg.engine_first_probe)
    return gate, f"on (probe: {cfg.engine_first_probe})"
