"""flashinfer's plan() staging buffers, rotated so that a plan never waits for the one before it.

A wrapper's plan() writes its schedule into a pinned host buffer (flashinfer 0.7.4:
`_pin_memory_int_workspace_buffer`, one per wrapper) and queues its copy to the device without
waiting for it; the buffer must not be written again until that copy has run. With one buffer, the
plan of step N+2 (engine.overlap_depth 2: launched while N runs and N+1 is queued) would wait, GIL
released, until N+1's copy runs, i.e. until N ends: a launch that blocks on the device, and that
the event loop's engine gate (handoff/gil_gate.py) takes for host work. Here each wrapper gets as
many buffers as plans whose copies may still be queued: a plan takes one whose copy has run (an
event recorded after that copy says so), a new one while fewer than MAX_BUFFERS exist, else waits
for the oldest. At depth 1 the first buffer is always free again, so nothing is allocated.

A flashinfer without that attribute plans one at a time, waiting for the previous plan's copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

STAGING_ATTR = "_pin_memory_int_workspace_buffer"
MAX_BUFFERS = 3  # per wrapper: engine.overlap_depth (at most 2) + 1 plans' copies in flight


class Event(Protocol):
    def record(self) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


def _pinned_like(buffer: torch.Tensor) -> torch.Tensor:
    return torch.empty(buffer.shape, dtype=buffer.dtype, device="cpu", pin_memory=True)


@dataclass(eq=False)  # compared by identity (list.remove): its fields hold tensors
class _Slot:
    buffer: torch.Tensor
    copied: Event | None = None  # recorded after the copy of the last plan that used it


class PlanStaging:
    """Owned by the attention backend (the engine thread's launches)."""

    def __init__(
        self,
        make_event: Callable[[], Event] = torch.cuda.Event,
        new_buffer: Callable[[torch.Tensor], torch.Tensor] = _pinned_like,
    ) -> None:
        self._make_event = make_event
        self._new_buffer = new_buffer
        self._slots: dict[int, list[_Slot]] = {}  # id(wrapper) -> its buffers, least recently used first
        self._last: Event | None = None  # the fallback's: the last plan's copy

    def plan(self, wrapper: Any, run_plan: Callable[[], None]) -> None:
        """Calls `run_plan` (the wrapper's plan()) with a staging buffer whose copy has run."""
        slots = self._slots_of(wrapper)
        if slots is None:
            if self._last is not None:
                self._last.synchronize()
            run_plan()
            self._last = self._recorded()
            return
        slot = self._free(slots)
        setattr(wrapper, STAGING_ATTR, slot.buffer)
        run_plan()
        slot.copied = self._recorded()
        slots.remove(slot)
        slots.append(slot)

    def buffers(self, wrapper: Any) -> int:
        """How many staging buffers `wrapper` has (for tests and logs)."""
        return len(self._slots.get(id(wrapper), []))

    def _slots_of(self, wrapper: Any) -> list[_Slot] | None:
        slots = self._slots.get(id(wrapper))
        if slots is None:
            first = getattr(wrapper, STAGING_ATTR, None)
            if not isinstance(first, torch.Tensor):
                return None
            slots = self._slots[id(wrapper)] = [_Slot(first)]
        return slots

    def _free(self, slots: list[_Slot]) -> _Slot:
        for slot in slots:
            if slot.copied is None or slot.copied.query():
                return slot
        if len(slots) < MAX_BUFFERS:
            slot = _Slot(self._new_buffer(slots[0].buffer))
            slots.append(slot)
            return slot
        oldest = slots[0]
        assert oldest.copied is not None
        oldest.copied.synchronize()
        return oldest

    def _recorded(self) -> Event:
        event = self._make_event()
        event.record()
        return event
