"""The engine's counters as one frozen snapshot, read by /metrics, /health and the benchmarks.

Taken from any thread without a lock while the engine thread steps: the fields are read one after
another, so one snapshot may mix two steps' counts (each count itself is whole).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rillet.core.engine.core import EngineCore
from rillet.core.outputs import StepOutput
from rillet.core.ring import SpscRing
from rillet.core.runner.inflight.device_timeline import DeviceTimeline
from rillet.core.sequence import Seq


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    steps: int
    prompt_tokens: int
    cached_prompt_tokens: int
    generated_tokens: int
    cached_blocks: int
    busy_seconds: float = 0.0  # wall time spent inside engine steps (incl. publishing)
    ring_wakeups: int = 0
    ring_full_waits: int = 0
    handoff_timeouts: int = 0  # model runs started after waiting stream.handoff_timeout_ms for the loop
    handoff_wait_seconds: float = 0.0  # of busy_seconds: waiting for the loop to take the last step
    device_wait_seconds: float = 0.0  # of busy_seconds: blocked waiting for launched steps' tokens
    spec_drafted: int = 0  # speculative decoding: draft tokens verified
    spec_accepted: int = 0  # ... of them accepted
    spec_verified: int = 0  # sequence-steps that verified a draft (each also gains the model's token)
    kv_tokens_total: int = 0  # tokens the pool holds: kv_blocks_total x block_size (cache.dtype sizes it)
    # sequences preempted for KV blocks, or for a better request's batch place (scheduler.policy
    # priority); their KV recomputed when readmitted
    preemptions: int = 0
    deterministic: bool = False  # engine.deterministic on (resolved at start-up)
    # CUDA (core/runner/inflight/device_timeline.py): the device's span of each step, and its idle time
    # between steps while the next one was due (the host launched it late)
    device_busy_seconds: float = 0.0
    device_prep_seconds: float = 0.0  # of device_busy_seconds: before each step's forward
    device_idle_seconds: float = 0.0
    device_late_launches: int = 0  # launches done after the device had finished the step before
    # LoRA adapters (names, sorted) of the running / waiting sequences (vllm:lora_requests_info)
    lora_running: tuple[str, ...] = ()
    lora_waiting: tuple[str, ...] = ()


def collect_stats(
    core: EngineCore,
    inbox_queued: int,
    busy: float,
    ring: SpscRing[StepOutput],
    timeline: DeviceTimeline | None = None,
    deterministic: bool = False,
) -> EngineStats:
    blocks = core.blocks
    spec = core.spec.stats if core.spec is not None else None
    sched = core.scheduler
    return EngineStats(
        running=core.num_running,
        waiting=core.num_waiting + inbox_queued,
        kv_blocks_used=blocks.num_used,
        kv_blocks_total=blocks.num_usable,
        kv_tokens_total=blocks.num_usable * blocks.block_size,
        steps=core.steps,
        preemptions=core.scheduler.preemptions,
        deterministic=deterministic,
        prompt_tokens=blocks.stats.queried_tokens,
        cached_prompt_tokens=blocks.stats.hit_tokens,
        generated_tokens=core.generated_tokens,
        cached_blocks=blocks.num_cached,
        busy_seconds=busy,
        ring_wakeups=ring.wakeups,
        ring_full_waits=ring.full_waits,
        handoff_timeouts=ring.release_timeouts,
        handoff_wait_seconds=ring.release_wait_s,
        device_wait_seconds=core.wait_seconds,
        spec_drafted=spec.drafted if spec else 0,
        spec_accepted=spec.accepted if spec else 0,
        spec_verified=spec.verified if spec else 0,
        device_busy_seconds=timeline.busy_seconds if timeline is not None else 0.0,
        device_idle_seconds=timeline.idle_seconds if timeline is not None else 0.0,
        device_prep_seconds=timeline.prep_seconds if timeline is not None else 0.0,
        device_late_launches=timeline.late_launches if timeline is not None else 0,
        lora_running=_adapters(sched.running),
        lora_waiting=_adapters(sched.waiting),
    )


def _adapters(seqs: Iterable[Seq]) -> tuple[str, ...]:
    # list() copies in one C call, under the GIL: the engine thread cannot change it meanwhile
    return tuple(sorted({s.lora.name for s in list(seqs) if s.lora is not None}))
