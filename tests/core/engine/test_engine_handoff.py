"""stream.handoff: on CPU the engine starts a model run only once the loop has handled the last step."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from rillet.core.config import ConfigError, config_from_dict
from rillet.core.engine.engine import Engine
from rillet.core.engine.handoff.publisher import resolve_handoff
from rillet.core.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("handoff", "kind", "device", "expected"),
    [
        ("auto", "gguf", "cpu", 0.005),
        ("auto", "hf", "cpu", 0.005),
        ("auto", "gguf", "cuda", None),  # the loop's work overlaps the GPU's: nothing to gain
        ("auto", "synthetic", "cpu", None),  # no model threads to compete with
        ("on", "synthetic", "cpu", 0.005),
        ("on", "gguf", "cuda", 0.005),
        ("off", "gguf", "cpu", None),
    ],
)
def test_handoff_resolution(handoff: str, kind: str, device: str, expected: float | None) -> None:
    cfg = config_from_dict({"model": {"kind": kind}, "stream": {"handoff": handoff}})
    assert resolve_handoff(cfg, device) == expected


def test_handoff_config_is_validated_by_key() -> None:
    with pytest.raises(ConfigError, match=r"stream\.handoff_timeout_ms"):
        config_from_dict({"stream": {"handoff_timeout_ms": 0}})
    with pytest.raises(ConfigError, match=r"stream\.handoff"):
        config_from_dict({"stream": {"handoff": "sometimes"}})


def _engine(handoff: str, timeout_ms: float = 2000.0) -> Engine:
    cfg = config_from_dict(
        {
            "model": {"kind": "synthetic", "synthetic_step_ms": 0.0},
            "cache": {"num_blocks": 64},
            "stream": {"handoff": handoff, "handoff_timeout_ms": timeout_ms},
        }
    )
    return Engine(cfg)


def _record(engine: Engine, events: list[str]) -> None:
    runner, ring = engine.core.runner, engine.ring
    run, push, release = runner.launch, ring.push, ring.release

    def recording_run(batch: Any) -> Any:
        events.append("run")
        return run(batch)

    def recording_push(item: Any, timeout: float | None = None) -> None:
        events.append("push")
        push(item, timeout)

    def recording_release() -> None:
        events.append("release")
        release()

    runner.launch = recording_run  # type: ignore[method-assign]
    ring.push = recording_push  # type: ignore[method-assign]
    ring.release = recording_release  # type: ignore[method-assign]


def _consume(engine: Engine, stop: threading.Event, handled: threading.Event) -> None:
    """A releasing consumer: it handles (releases) each batch it pops once `handled` is set."""
    ring = engine.ring
    while not stop.is_set():
        if ring.pop_all():
            handled.wait()
            ring.release()
        time.sleep(0.001)


@pytest.mark.parametrize("handoff", ["on", "off"])
def test_with_handoff_each_run_waits_for_the_release_of_the_previous_step(handoff: str) -> None:
    # On: the consumer handles every batch (after a pause), and each run must come after the
    # release of the step before it. Off: the consumer handles nothing until the engine is idle,
    # so the engine must run all its steps without one release (it never waits for the loop).
    engine = _engine(handoff, timeout_ms=60_000.0)  # a timeout on a slow machine is no pass
    assert engine.hands_off is (handoff == "on")
    events: list[str] = []
    _record(engine, events)
    stop, handled = threading.Event(), threading.Event()
    if handoff == "on":
        handled.set()
    engine.ring.set_notifier(lambda: None, releases=True)
    consumer = threading.Thread(target=_consume, args=(engine, stop, handled))
    consumer.start()
    try:
        engine.start()
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        engine.add_request("r", engine.tokenizer.encode("hello"), params)
        assert engine.wait_idle(60)
        handled.set()
        stop.set()
        consumer.join(30)
    finally:
        stop.set()
        handled.set()
        engine.shutdown()
    runs = [i for i, e in enumerate(events) if e == "run"]
    assert len(runs) == 4 and events.count("push") == 4
    assert engine.stats().handoff_timeouts == 0
    # Before every run but the first: the previous step was pushed, and (handoff on) released.
    for i in runs[1:]:
        before = [e for e in events[:i] if e != "run"]
        if handoff == "on":
            assert before[-2:] == ["push", "release"], events
        else:
            assert before[-1] == "push" and "release" not in before, events


def test_a_consumer_that_never_releases_costs_at_most_the_timeout_per_step() -> None:
    engine = _engine("on", timeout_ms=20.0)
    engine.ring.set_notifier(lambda: None, releases=True)  # claims to release, never does
    try:
        engine.start()
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        engine.add_request("r", engine.tokenizer.encode("hello"), params)
        assert engine.wait_idle(60)  # each wait ends at its 20 ms timeout: no hang (counted below)
        assert sum(len(d.token_ids) for out in engine.ring.pop_all() for d in out.deltas) == 6
        assert engine.stats().handoff_timeouts == 5  # before each run but the first
    finally:
        engine.shutdown()
