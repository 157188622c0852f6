"""The engine gate (core/engine/handoff/gil_gate.py): the event loop parks while the engine does host
work, until the engine's next device wait begins; never with the gate open, never for longer than
its bound; the three probes; and when the engine gets a gate at all."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from http_helpers import wait_for
from rillet.core.config import ConfigError, config_from_dict
from rillet.core.engine.handoff import gil_gate
from rillet.core.engine.handoff.gil_gate import EngineGate, resolve_gate


def parked_until_released(gate: EngineGate, release: Callable[[], object]) -> tuple[bool, bool]:
    """A loop thread calls give_way(); this thread then calls `release` once the loop is inside
    its park. Returns (gave way, the park ended only after the release)."""
    released = threading.Event()
    out: list[bool] = []

    def loop() -> None:
        parked = gate.give_way()
        out.append(parked)
        out.append(released.is_set())

    t = threading.Thread(target=loop)
    t.start()
    wait_for(lambda: bool(gate._cond._waiters), 30, "the loop to park")  # type: ignore[attr-defined]
    released.set()
    release()
    t.join(10)
    return out[0], out[1]


def test_the_loop_runs_freely_while_the_engine_waits_and_parks_while_it_works() -> None:
    gate = EngineGate(max_park_s=30)
    assert gate.give_way() is False  # before the first step: the engine is not working
    gate.waiting()  # an idle engine (no step to probe)
    assert gate.give_way() is False
    gate.working()
    gave_way, after = parked_until_released(gate, gate.waiting)
    assert gave_way and after  # parked until the engine's next wait began, not before
    assert gate.parks == 1


def test_a_park_is_bounded_and_an_open_gate_never_parks() -> None:
    gate = EngineGate(max_park_s=0.01)
    gate.working()
    assert gate.give_way() is True  # nobody calls waiting(): the bound ends it
    gate.open()
    assert gate.give_way() is False
    working = EngineGate(max_park_s=30)
    working.working()
    gave_way, after = parked_until_released(working, working.open)  # the engine stops meanwhile
    assert gave_way and after


def test_the_device_probe_parks_the_loop_once_the_awaited_step_is_done() -> None:
    gate = EngineGate(max_park_s=30, probe_mode="device")
    done = [False]
    gate.waiting(lambda: done[0])
    assert gate.give_way() is False  # the device is still on it
    done[0] = True
    gave_way, after = parked_until_released(gate, lambda: (gate.working(landed=True), gate.waiting()))
    assert gave_way and after


def test_the_clock_probe_forecasts_the_end_from_the_landings(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(gil_gate.time, "perf_counter", lambda: now[0])
    gate = EngineGate(probe_mode="clock")
    gate.waiting(lambda: True)
    assert gate._probe is None  # no period measured yet: nothing to forecast
    for t in (100.0, 100.010, 100.020):  # landings every 10 ms
        now[0] = t
        gate.working(landed=True)
    gate.waiting(lambda: False)  # the device's own answer is not asked
    now[0] = 100.025
    assert gate.give_way() is False  # forecast end: 100.030 less the margin
    now[0] = 100.030 - gil_gate.CLOCK_MARGIN_S / 2
    probe = gate._probe
    assert probe is not None and probe()
    gate.working()  # idle: the next landing starts a new period
    assert gate._landed_at == 0.0


def test_without_a_probe_the_loop_gives_way_only_to_a_working_engine() -> None:
    gate = EngineGate(probe_mode="none")
    gate.waiting(lambda: True)
    assert gate.give_way() is False


@pytest.mark.parametrize(
    ("mode", "async_launch", "hands_off", "on"),
    [
        ("on", True, False, True),
        ("off", True, False, False),
        ("on", False, False, False),  # a launch runs the model: the engine never waits on a device
        ("on", True, True, False),  # the engine waits for the loop: the loop must not wait back
    ],
)
def test_when_the_engine_gets_a_gate(mode: str, async_launch: bool, hands_off: bool, on: bool) -> None:
    cfg = config_from_dict({"stream": {"engine_first": mode, "engine_first_probe": "clock"}}).stream
    gate, why = resolve_gate(cfg, async_launch, hands_off)
    assert (gate is not None) is on and why.startswith("on" if on else "off")
    if gate is not None:
        assert gate.probe_mode == "clock" and gate.max_park_s == pytest.approx(0.005)


def test_the_config_is_checked_by_key() -> None:
    assert config_from_dict({"stream": {"engine_first": True}}).stream.engine_first == "on"  # YAML's on
    with pytest.raises(ConfigError, match=r"stream\.engine_first_probe"):
        config_from_dict({"stream": {"engine_first_probe": "psychic"}})
    with pytest.raises(ConfigError, match=r"stream\.engine_first_max_park_ms"):
        config_from_dict({"stream": {"engine_first_max_park_ms": 0}})


def test_announcing_the_same_wait_again_is_nothing() -> None:
    """The engine announces a wait at the publish and again as it lands: one wait, so a loop parked
    until the engine's next wait is not let go by the repeat."""
    gate = EngineGate(probe_mode="device")

    def step() -> bool:
        return True

    gate.waiting(step)
    waits = gate._waits
    gate.waiting(step)
    assert gate._waits == waits
    gate.working(landed=True)
    gate.waiting(step)  # the next step's wait (a new launch in the engine)
    assert gate._waits == waits + 1
