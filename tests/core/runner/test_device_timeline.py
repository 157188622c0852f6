"""The device timeline's accounting (core/runner/inflight/device_timeline.py), with a stand-in for CUDA's
timing events on one stream: an event is reached when the host records it or when the device has
finished the work queued before it, whichever is later."""

from __future__ import annotations

import pytest
import torch
from rillet.core.runner.inflight import device_timeline
from rillet.core.runner.inflight.device_timeline import DeviceTimeline


class Stream:
    now = 0.0  # the host's clock, ms
    tail = 0.0  # when the device finishes the work queued so far


class FakeEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing, "the timeline needs timing events"
        self.t = 0.0

    def record(self) -> None:
        self.t = max(Stream.now, Stream.tail)

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.t - self.t


@pytest.fixture(autouse=True)
def fake_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_timeline.torch.cuda, "Event", FakeEvent)
    Stream.now = Stream.tail = 0.0


def run(ms: float) -> torch.cuda.Event:
    """Queues `ms` of device work at the host's `now`; returns the event recorded after it."""
    Stream.tail = max(Stream.now, Stream.tail) + ms
    done = FakeEvent(enable_timing=True)
    done.t = Stream.tail
    return done  # type: ignore[return-value]


def test_overlapped_steps_count_their_spans_and_the_gap_a_late_host_left() -> None:
    tl = DeviceTimeline()
    a = tl.begin()  # nothing in flight
    da = run(5)  # a: 0 -> 5
    Stream.now = 1.0
    b = tl.begin()  # queued while a runs: the device starts it at 5
    db = run(5)  # b: 5 -> 10
    tl.end(a, da)
    Stream.now = 12.0
    c = tl.begin()  # b in flight, but the device finished it at 10: launched 2 ms late
    tl.end(b, db)
    dc = run(4)  # c: 12 -> 16
    tl.end(c, dc)
    assert tl.steps == 3
    assert tl.busy_seconds == pytest.approx((5 + 5 + 4) / 1000)
    assert tl.idle_seconds == pytest.approx(2 / 1000)


def test_an_idle_engine_and_unmeasured_steps_add_no_idle_time() -> None:
    tl = DeviceTimeline()
    a = tl.begin()
    tl.end(a, run(2))
    Stream.now = 50.0  # the engine had nothing to do: it launches with nothing in flight
    b = tl.begin()
    tl.end(b, run(3))
    assert tl.idle_seconds == 0.0
    assert tl.busy_seconds == pytest.approx(0.005)
    c = tl.begin()  # copies nothing back (prefill chunks that sample nothing)
    Stream.now = 60.0
    d = tl.begin()
    tl.end(c, None)  # neither its span nor the gap after it is measured
    tl.end(d, run(1))
    assert (tl.steps, tl.idle_seconds) == (3, 0.0)
    assert tl.busy_seconds == pytest.approx(0.006)


class FakeDone(FakeEvent):
    def query(self) -> bool:
        return Stream.now >= self.t


def test_the_forward_mark_splits_busy_and_a_launch_done_after_the_step_before_is_late() -> None:
    tl = DeviceTimeline()
    a = tl.begin()
    Stream.tail = 1.0  # a's inputs
    tl.forward(a)
    da = FakeDone(enable_timing=True)
    Stream.tail = da.t = 5.0  # a: 0 -> 5, its forward from 1
    tl.launched(a, da)
    Stream.now = 2.0
    b = tl.begin()  # the device reaches it at 5
    Stream.now = 6.0  # the host queues b's forward after a has ended: the device waited
    tl.forward(b)
    db = FakeDone(enable_timing=True)
    Stream.tail = db.t = 10.0
    tl.launched(b, db)  # a had finished (5 <= 6): late
    tl.end(a, da)
    tl.end(b, db)
    assert tl.late_launches == 1
    assert tl.busy_seconds == pytest.approx(0.010)
    assert tl.prep_seconds == pytest.approx((1 + 1) / 1000)  # b: 5 -> 6
    assert tl.idle_seconds == 0.0
