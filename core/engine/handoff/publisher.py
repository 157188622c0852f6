"""When a step's output reaches the ring: held until the next step is scheduled.

The engine publishes step N's deltas once step N+1 is scheduled, so that the event loop's work on
them overlaps the model's instead of competing with the scheduling for the GIL:
  - just after step N+1's launch when launches are asynchronous (CUDA, the asynchronous null
    engine): the device is busy by then, so the loop's callback (which holds the GIL while it
    routes and writes) never delays a launch; published before the launch, a loop woken on the
    engine's core ran first and the launch waited for it (the null engine, 5 ms steps, one stream:
    5 % fewer tokens/s streamed than not, the loop's work added to every step);
  - just before step N+1's model run when a launch runs the model (CPU), and, with
    `stream.handoff` (CPU models), after waiting at most handoff_timeout until the loop has routed
    them, so the loop's work runs between model runs instead of taking cores from the model's
    threads;
or at once when no step follows.
"""

from __future__ import annotations

from rillet.core.config import RilletConfig
from rillet.core.outputs import StepOutput
from rillet.core.ring import SpscRing


def resolve_handoff(cfg: RilletConfig, device_type: str) -> float | None:
    """Seconds the engine may wait for the consumer before a model run (None = it never waits)."""
    mode = cfg.stream.handoff
    if mode == "auto":
        mode = "on" if device_type == "cpu" and cfg.model.kind != "synthetic" else "off"
    return cfg.stream.handoff_timeout_ms / 1000 if mode == "on" else None


class Publisher:
    """Holds at most one step's output (the engine thread's only). Not thread-safe."""

    __slots__ = ("_handoff_s", "_held", "_ring", "after_launch", "before_run")

    def __init__(
        self, ring: SpscRing[StepOutput], handoff_s: float | None, async_launch: bool = False
    ) -> None:
        """`async_launch`: a launch only enqueues the step (the device runs it meanwhile)."""
        self._ring = ring
        self._handoff_s = handoff_s
        self._held: StepOutput | None = None
        # EngineCore.step's hooks: exactly one of them publishes
        publish = self.flush if handoff_s is None else self._flush_and_hand_off
        self.before_run = _nothing if async_launch else publish
        self.after_launch = publish if async_launch else _nothing

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


def _nothing() -> None:
    pass
