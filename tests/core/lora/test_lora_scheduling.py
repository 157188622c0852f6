"""The scheduler with fewer LoRA slots than adapters (fake steps, no tensors): a request waiting for
a slot holds back the other adapters' requests behind it, never the base model's."""

from __future__ import annotations

from rillet.core.config import SchedulerConfig
from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.scheduler import Scheduler
from rillet.core.lora.adapter import LoraAdapter
from rillet.core.lora.slots import SlotTable
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason, Seq


def _seq(i: int, adapter: LoraAdapter | None, max_tokens: int = 4) -> Seq:
    seq = Seq(i, f"r{i}", [i + 1, i + 2, i + 3], SamplingParams(max_tokens=max_tokens))
    seq.lora = adapter
    return seq


def test_base_requests_pass_one_waiting_for_a_slot() -> None:
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64), BlockManager(64, 4))
    s.lora_slots = SlotTable(1)
    a, b = (LoraAdapter(n, "-", uid, 4, 1.0, {}) for uid, n in ((1, "a"), (2, "b")))
    long_a = _seq(0, a, max_tokens=100)
    s.add(long_a)
    assert s.schedule().seqs == [long_a]  # holds the only slot
    wait_b, base, later_a = _seq(1, b), _seq(2, None), _seq(3, a)
    for seq in (wait_b, base, later_a):
        s.add(seq)
    batch = s.schedule()
    assert batch.seqs == [long_a, base]  # the base request is not held back by b's
    assert list(s.waiting) == [wait_b, later_a]  # a's later request stays behind b's (b is next)
    s.finish(long_a, FinishReason.ABORT)  # its slot frees: b's request takes it, a's waits again
    assert s.schedule().seqs == [base, wait_b] and list(s.waiting) == [later_a]
