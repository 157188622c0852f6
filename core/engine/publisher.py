"""When a step's output reaches the ring: held until the next step starts its model run.

The engine publishes step N's deltas just before step N+1's model run (EngineCore.step's
`before_run`), so the event loop's work on them overlaps the device's work instead of competing
with the scheduling for the GIL; or at once when no step follows. With `stream.handoff` (CPU
models) it then waits, at most handoff_timeout, until the loop has routed and written them, so
the loop's work runs between model runs instead of taking cores from the model's threads.
"""

from __future__ import annotations

from rillet.core.outputs import StepOutput
from rillet.core.ring import SpscRing


class Publisher:
    """Holds at most one step's output (the engine thread's only). Not thread-safe."""

    __slots__ = ("_handoff_s", "_held", "_ring", "before_run")

    def __init__(self, ring: SpscRing[StepOutput], handoff_s: float | None) -> None:
        self._ring = ring
        self._handoff_s = handoff_s
        self._held: StepOutput | None = None
        self.before_run = self.flush if handoff_s is None else self._flush_and_hand_off

    def hold(self, out: StepOutput) -> None:
        """Keeps `out` until the next model run (or flush); whatever was held goes out first."""
        self.flush()
        self._held = out

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._ring.push(held)

    def _flush_and_hand_off(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._ring.push(held)
            self._ring.wait_released(self._handoff_s or 0.0)

    def salvage(self) -> None:
        """After a crash: what was held goes out if the ring has room (never blocks)."""
        held, self._held = self._held, None
        if held is not None:
            self._ring.try_push(held)
