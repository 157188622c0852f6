"""When the engine publishes a step's output: as the next step starts its model run, or at once
when no step follows (so the front end's work overlaps the model, and nothing waits at the end)."""

from __future__ import annotations

from typing import Any

from rillet.core.config import config_from_dict
from rillet.core.engine.engine import Engine
from rillet.core.sampling_params import SamplingParams


def test_a_step_is_published_when_the_next_one_runs_and_the_last_at_once() -> None:
    cfg = config_from_dict(
        {"model": {"kind": "synthetic", "synthetic_step_ms": 0.0}, "cache": {"num_blocks": 64}}
    )
    engine = Engine(cfg)
    events: list[Any] = []
    runner, ring, scheduler = engine.core.runner, engine.ring, engine.core.scheduler
    run, push, schedule = runner.launch, ring.push, scheduler.schedule

    def recording_schedule() -> Any:
        batch = schedule()
        if batch.seqs:
            events.append("schedule")
        return batch

    def recording_run(batch: Any) -> Any:
        events.append("run")
        return run(batch)

    def recording_push(item: Any, timeout: float | None = None) -> None:
        events.append(("push", [len(d.token_ids) for d in item.deltas]))
        push(item, timeout)

    runner.launch = recording_run  # type: ignore[method-assign]
    ring.push = recording_push  # type: ignore[method-assign]
    scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    try:
        engine.start()
        params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        engine.add_request("r", engine.tokenizer.encode("hello"), params)
        assert engine.wait_idle(10)
        # step 1 (prefill + token 1); step 2 publishes step 1 once scheduled, just before it runs;
        # step 3 publishes step 2; step 3's output (the last token) goes out at once.
        one = ("push", [1])
        assert events == ["schedule", "run", "schedule", one, "run", "schedule", one, "run", one]
        deltas = [d for out in ring.pop_all() for d in out.deltas]
        assert [len(d.token_ids) for d in deltas] == [1, 1, 1]
        assert deltas[-1].finish_reason is not None
    finally:
        engine.shutdown()
