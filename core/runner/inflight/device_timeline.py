"""Where a CUDA device's time goes across the engine's steps, from timing events (/metrics).

Each launch records an event before its first device work (`begin`) and one before the model's
forward (`forward`); the step's one device->host copy records the last (sample_output.py). When the
launch has queued everything (`launched`) and when the step lands (`end`, after that copy):
  busy  += start -> done: the step's span on the device, including any time the device waited in
           the middle of it for the host to queue the rest (a launch is ~10-100 small ops);
  prep  += start -> forward, of busy: the step's input copies and small kernels before the forward,
           and any wait for the host to queue the forward;
  idle  += previous done -> start, counted only when the previous step was still in flight (not
           landed) at this launch: the device drained the queue before the host had begun the
           next step. An engine with nothing to do is not counted: it launches with nothing in
           flight.
  late  += 1 when the step before had already finished on the device by the time this launch had
           queued its last op: the device waited for this launch (in `idle`, or in `busy` when the
           device had reached its first ops).
With engine.overlap the host prepares step N+1 while N runs, so idle and late stay ~0 while the
device is the bottleneck; they grow when the host is, e.g. when the event loop's work holds the GIL
the engine thread needs (bench/gpu/GPU.md, part (d)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class StepMarks:
    start: torch.cuda.Event
    follows: bool  # the previous step was still in flight when this one was launched
    forward: torch.cuda.Event | None = None


class DeviceTimeline:
    """Owned by the engine thread (launch and land); the counters are read from any thread."""

    __slots__ = (
        "_in_flight",
        "_last_launched",
        "_prev_done",
        "busy_seconds",
        "idle_seconds",
        "late_launches",
        "prep_seconds",
        "steps",
    )

    def __init__(self) -> None:
        self.busy_seconds = 0.0
        self.prep_seconds = 0.0
        self.idle_seconds = 0.0
        self.late_launches = 0
        self.steps = 0  # steps whose span was measured
        self._in_flight = 0  # launched, not yet landed
        self._prev_done: torch.cuda.Event | None = None  # the last landed step's copy event
        self._last_launched: torch.cuda.Event | None = None  # the last launched step's copy event

    def begin(self) -> StepMarks:
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        marks = StepMarks(start, self._in_flight > 0)
        self._in_flight += 1
        return marks

    def forward(self, marks: StepMarks) -> None:
        """Just before the step's model forward is queued."""
        marks.forward = torch.cuda.Event(enable_timing=True)
        marks.forward.record()

    def launched(self, marks: StepMarks, done: torch.cuda.Event | None) -> None:
        """The launch has queued its last op (`done`: its copy event, None when it has none)."""
        before, self._last_launched = self._last_launched, done
        if marks.follows and before is not None and before.query():
            self.late_launches += 1

    def end(self, marks: StepMarks, done: torch.cuda.Event | None) -> None:
        """After `done` has fired (None: the step copied nothing back, e.g. prefill chunks that
        sample nothing, or its launch failed; it is not measured, nor the gap after it)."""
        self._in_flight -= 1
        prev, self._prev_done = self._prev_done, done
        if done is None:
            return
        self.busy_seconds += marks.start.elapsed_time(done) / 1000
        if marks.forward is not None:
            self.prep_seconds += marks.start.elapsed_time(marks.forward) / 1000
        self.steps += 1
        if marks.follows and prev is not None:
            self.idle_seconds += prev.elapsed_time(marks.start) / 1000
