"""flashinfer's plan() staging buffers (core/attention/plan_staging.py): a plan never writes a
buffer whose previous copy to the device may still be queued, and never waits while a buffer can
be added; with one plan in flight at a time (engine.overlap_depth 1) one buffer is all there is.

CUDA events and pinned memory are stood in for: an event's copy "runs" when the test says so."""

from __future__ import annotations

from typing import Any

import torch
from rillet.core.attention.plan_staging import MAX_BUFFERS, STAGING_ATTR, PlanStaging


class FakeEvent:
    def __init__(self) -> None:
        self.done = False
        self.waited = False

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = True
        self.done = True


class Wrapper:
    def __init__(self) -> None:
        setattr(self, STAGING_ATTR, torch.zeros(8, dtype=torch.uint8))


class Recorder:
    """Plans through a PlanStaging, remembering each plan's buffer and the event after it."""

    def __init__(self) -> None:
        self.events: list[FakeEvent] = []
        self.staging = PlanStaging(make_event=self._event, new_buffer=lambda b: torch.zeros_like(b))
        self.used: list[torch.Tensor] = []  # the buffer each plan wrote
        self.pending: dict[int, FakeEvent] = {}  # id(buffer) -> the event of its last plan

    def _event(self) -> FakeEvent:
        self.events.append(FakeEvent())
        return self.events[-1]

    def plan(self, wrapper: Any) -> torch.Tensor:
        def run_plan() -> None:
            buffer = getattr(wrapper, STAGING_ATTR)
            before = self.pending.get(id(buffer))
            assert before is None or before.done, "a plan wrote a buffer whose copy had not run"
            self.used.append(buffer)

        self.staging.plan(wrapper, run_plan)
        self.pending[id(self.used[-1])] = self.events[-1]
        return self.used[-1]


def test_one_plan_in_flight_keeps_one_buffer() -> None:
    r, w = Recorder(), Wrapper()
    first = r.plan(w)
    for _ in range(5):
        r.events[-1].done = True  # depth 1: the last plan's copy ran before the next plan
        assert r.plan(w) is first
    assert r.staging.buffers(w) == 1 and not any(e.waited for e in r.events)


def test_plans_in_flight_get_buffers_of_their_own_then_wait_for_the_oldest() -> None:
    r, w = Recorder(), Wrapper()
    bufs = [r.plan(w) for _ in range(MAX_BUFFERS)]  # no copy has run: each takes a new buffer
    assert len({id(b) for b in bufs}) == MAX_BUFFERS and not any(e.waited for e in r.events)
    again = r.plan(w)  # all in flight: waits for the oldest and reuses it
    assert again is bufs[0] and r.events[0].waited
    assert r.staging.buffers(w) == MAX_BUFFERS


def test_a_buffer_whose_copy_ran_is_reused_before_a_new_one_is_made() -> None:
    r, w = Recorder(), Wrapper()
    a, b = r.plan(w), r.plan(w)  # depth 2: two in flight
    r.events[0].done = True  # the older one's copy ran
    assert r.plan(w) is a and r.staging.buffers(w) == 2
    r.events[1].done = True
    assert r.plan(w) is b and not any(e.waited for e in r.events)


def test_wrappers_have_their_own_buffers() -> None:
    r, w1, w2 = Recorder(), Wrapper(), Wrapper()
    assert r.plan(w1) is not r.plan(w2)
    assert r.staging.buffers(w1) == r.staging.buffers(w2) == 1


def test_a_flashinfer_without_the_buffer_plans_one_at_a_time() -> None:
    r = Recorder()
    w = object()  # no staging attribute: nothing to rotate
    planned: list[int] = []
    for i in range(3):
        r.staging.plan(w, lambda i=i: planned.append(i))
    assert planned == [0, 1, 2]
    assert r.events[0].waited and r.events[1].waited and not r.events[2].waited
