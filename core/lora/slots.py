"""Which adapter sits in which slot of the stacked buffers: plain Python, no tensors.

The scheduler owns it. A sequence of an adapter takes a reference on the adapter's slot when it
is admitted and drops it when it finishes or is preempted; a slot with references is never
rewritten. An adapter that is not resident takes a free slot, else the least recently used idle
one (its adapter stays in host memory and comes back on its next request); with every slot busy
the request waits in the queue. Each placement is handed to the runner as a write, done before
the step that first reads it (on CUDA the copy is queued after the step in flight, in stream order).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rillet.core.lora.adapter import LoraAdapter

SlotWrite = tuple[int, "LoraAdapter"]  # (slot, adapter to copy into it)


class SlotTable:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.owner: list[LoraAdapter | None] = [None] * (num_slots + 1)  # index 0: the base model
        self.refs = [0] * (num_slots + 1)
        self._slot_of: dict[int, int] = {}  # adapter uid -> its slot
        self._idle: OrderedDict[int, None] = OrderedDict()  # resident, unreferenced; first = LRU
        self.loads = 0  # adapters copied into a slot (a counter for tests and metrics)

    def acquire(self, adapter: LoraAdapter, writes: list[SlotWrite]) -> int | None:
        """The adapter's slot with one more reference, or None when every slot is busy. A new
        placement is appended to `writes`."""
        slot = self._slot_of.get(adapter.uid)
        if slot is None:
            slot = self._place(adapter)
            if slot is None:
                return None
            writes.append((slot, adapter))
        self._idle.pop(slot, None)
        self.refs[slot] += 1
        return slot

    def release(self, slot: int) -> None:
        assert self.refs[slot] > 0, f"LoRA slot {slot} released twice"
        self.refs[slot] -= 1
        if self.refs[slot] == 0:
            self._idle[slot] = None  # most recently used: evicted last

    def resident(self, uid: int) -> bool:
        return uid in self._slot_of

    def _place(self, adapter: LoraAdapter) -> int | None:
        empty = next((s for s in range(1, self.num_slots + 1) if self.owner[s] is None), None)
        if empty is None:
            if not self._idle:
                return None
            empty, _ = self._idle.popitem(last=False)
            old = self.owner[empty]
            assert old is not None
            del self._slot_of[old.uid]
        self.owner[empty] = adapter
        self._slot_of[adapter.uid] = empty
        self.loads += 1
        return empty

    def busy(self) -> int:
        """Slots referenced by running sequences."""
        return sum(1 for r in self.refs[1:] if r)
