"""The asynchronous null engine and engine.overlap through the threaded engine: resolution, the
simulated device timeline, and on/off giving the same streams (stop strings, n > 1, aborts)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from rillet.core.config import ConfigError, config_from_dict
from rillet.core.engine.overlap import resolve_overlap
from rillet.core.engine.scheduler import ScheduledBatch
from rillet.core.llm import LLM
from rillet.core.runner import synthetic as synthetic_runner
from rillet.core.runner.synthetic import SyntheticRunner
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason, Seq


@pytest.mark.parametrize(
    ("mode", "device", "kind", "synthetic_async", "on"),
    [
        ("auto", "cuda", "gguf", False, True),
        ("auto", "cpu", "gguf", False, False),
        ("auto", "cpu", "hf", False, False),
        ("auto", "cpu", "synthetic", True, True),
        ("auto", "cpu", "synthetic", False, False),
        ("on", "cpu", "gguf", False, True),
        ("off", "cuda", "gguf", False, False),
    ],
)
def test_overlap_resolution(mode: str, device: str, kind: str, synthetic_async: bool, on: bool) -> None:
    got, why = resolve_overlap(mode, device, kind, synthetic_async)
    assert got is on and why.startswith("on" if on else "off")


def test_overlap_config_is_validated_by_key() -> None:
    with pytest.raises(ConfigError, match=r"engine\.overlap"):
        config_from_dict({"engine": {"overlap": "sometimes"}})
    for depth in (0, 3):
        with pytest.raises(ConfigError, match=r"engine\.overlap_depth"):
            config_from_dict({"engine": {"overlap_depth": depth}})
    with pytest.raises(ConfigError, match=r"model\.synthetic_async"):
        config_from_dict({"model": {"synthetic_async": "yes"}})
    assert config_from_dict({"engine": {"overlap": True}}).engine.overlap == "on"  # YAML's bare on


def test_async_null_engine_launches_at_once_and_queues_steps_on_a_device_timeline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # "Did not wait" is checked by the sleeps the runner asks for, not by the clock: a busy machine
    # may take longer than a step between two lines of this test.
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        time.sleep(s)

    monkeypatch.setattr(
        synthetic_runner, "time", SimpleNamespace(perf_counter=time.perf_counter, sleep=sleep)
    )
    runner = SyntheticRunner(step_ms=50.0, token_pool=list(range(100, 200)), asynchronous=True)
    seqs = [Seq(i, f"r{i}", [i + 1, 2, 3], SamplingParams()) for i in range(3)]
    batch = ScheduledBatch(seqs=list(seqs), num_new=[3, 3, 3])
    t0 = time.perf_counter()
    first = runner.launch(batch)
    for seq in seqs:
        seq.num_computed, seq.num_pending = 3, 1
    second = runner.launch(ScheduledBatch(seqs=list(seqs), num_new=[1, 1, 1]))
    # the second step starts on the device when the first ends, whatever the host did meanwhile
    assert second.ready_at == pytest.approx(first.ready_at + 0.05)  # type: ignore[attr-defined]
    assert first.ready_at >= t0 + 0.05  # type: ignore[attr-defined]  # a step from its launch on
    assert slept == []  # the launches did not wait for the device
    result = first.wait()
    assert time.perf_counter() >= first.ready_at  # type: ignore[attr-defined]
    assert len(result.token_ids) == 3 and [s.seq_id for s in first.seqs] == [0, 1, 2]
    for seq, token in zip(seqs, result.token_ids, strict=True):  # the engine lands the first step
        seq.output_ids.append(token)
        seq.num_pending = 0
    assert second.wait().token_ids != result.token_ids  # the next position's tokens


def test_host_time_is_spent_in_the_launch_with_the_gil_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """model.synthetic_host_ms: a GPU engine's host-side step work (attention plan, launches),
    spent inside launch() before the step goes on the device timeline; async engines only."""
    held: list[float] = []
    monkeypatch.setattr(synthetic_runner, "_hold_gil", held.append)
    runner = SyntheticRunner(5.0, list(range(100, 200)), asynchronous=True, host_ms=1.5)
    seqs = [Seq(i, f"r{i}", [i + 1, 2, 3], SamplingParams()) for i in range(2)]
    runner.launch(ScheduledBatch(seqs=list(seqs), num_new=[3, 3]))
    assert held == [0.0015]
    synthetic_runner._hold_gil(0.0)  # the real one returns (the bench sets milliseconds)
    assert config_from_dict(
        {"model": {"synthetic_async": True, "synthetic_host_ms": 1.5}}
    ).model.synthetic_host_ms
    for bad in ({"synthetic_host_ms": -1.0, "synthetic_async": True}, {"synthetic_host_ms": 1.0}):
        with pytest.raises(ConfigError, match=r"model\.synthetic_host_ms"):
            config_from_dict({"model": bad})


def _run(
    overlap: str, abort: bool, depth: int = 1
) -> dict[str, list[tuple[list[int], FinishReason | None, str]]]:
    cfg = config_from_dict(
        {
            "model": {"kind": "synthetic", "synthetic_step_ms": 1.0, "synthetic_async": True},
            "cache": {"num_blocks": 64, "block_size": 8},
            "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 32},
            "engine": {"overlap": overlap, "overlap_depth": depth},
        }
    )
    with LLM(cfg) as llm:
        assert llm.engine.overlap is (overlap == "on")
        tok = llm.tokenizer
        prompts = [f"prompt number {i} about streams" for i in range(6)]
        first = llm.generate([prompts[0]], SamplingParams(max_tokens=30, temperature=0.0))[0]
        stop = first.outputs[0].text[10:13]  # a stop string the synthetic text really contains
        params = [SamplingParams(max_tokens=20 + 3 * i, temperature=0.0, stop=(stop,)) for i in range(6)]
        if abort:  # a long request that another thread aborts mid-stream
            llm.engine.add_request("long", tok.encode("abort me"), SamplingParams(max_tokens=200))
            time.sleep(0.05)
            llm.engine.abort("long")
        outs = llm.generate(prompts, params, n=2)
        core = llm.engine.core
        assert llm.engine.wait_idle(10)
        core.blocks.check_integrity()
        assert core.blocks.num_used == 0 and not core.seqs
        return {
            o.request_id[:0] + str(i): [(c.token_ids, c.finish_reason, c.text) for c in o.outputs]
            for i, o in enumerate(outs)
        }


@pytest.mark.parametrize("depth", [1, 2])
def test_overlap_on_and_off_stream_the_same_tokens_through_the_engine_thread(depth: int) -> None:
    off, on = _run("off", abort=False), _run("on", abort=True, depth=depth)
    assert on == off
    finishes = [f for choices in on.values() for _, f, _ in choices]
    assert FinishReason.STOP in finishes and FinishReason.LENGTH in finishes


@pytest.mark.parametrize("asynchronous", [True, False])
def test_a_step_is_published_after_an_asynchronous_launch_and_before_a_synchronous_one(
    asynchronous: bool,
) -> None:
    """core/engine/handoff/publisher.py: with launches that only enqueue (CUDA, the asynchronous null
    engine), the previous step's output goes to the ring just after the next launch, so a loop woken
    by it never delays a launch; a launch that runs the model is preceded by the publish instead."""
    from rillet.core.engine.engine import Engine

    cfg = config_from_dict(
        {
            "model": {"kind": "synthetic", "synthetic_step_ms": 1.0, "synthetic_async": asynchronous},
            "cache": {"num_blocks": 64},
        }
    )
    engine = Engine(cfg)
    assert engine.async_launch is asynchronous
    events: list[str] = []
    launch, push = engine.core.runner.launch, engine.ring.push

    def recording_launch(batch: ScheduledBatch) -> object:
        events.append("launch")
        return launch(batch)

    def recording_push(item: object, timeout: float | None = None) -> None:
        events.append("push")
        push(item, timeout)  # type: ignore[arg-type]

    engine.core.runner.launch = recording_launch  # type: ignore[method-assign,assignment]
    engine.ring.push = recording_push  # type: ignore[method-assign]
    try:
        engine.start()
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        engine.add_request("r", engine.tokenizer.encode("hello"), params)
        assert engine.wait_idle(60)
    finally:
        engine.shutdown()
    last = max(i for i, e in enumerate(events) if e == "launch")
    assert events.count("launch") == 6
    # every step's output that a later launch publishes goes out right after it (asynchronous) or
    # right before it; what is left when the engine falls idle goes out after the last launch
    published = [i for i, e in enumerate(events[:last]) if e == "push"]
    assert len(published) >= 3, events
    for i in published:
        assert events[i - 1 if asynchronous else i + 1] == "launch", events
