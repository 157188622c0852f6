"""A process that only loads a saved step must ask Linux for AMX before running it.

A library built where Inductor found AMX runs tile instructions; torch.compile asks for the tile
state (arch_prctl XTILEDATA) while it picks the ISA, a server that loads the library compiles
nothing and never would: on an AMX Xeon it died of SIGILL at the first step (seen 2026-12-02 with
the default model's int4 step). The CPU here may or may not have AMX, so the order is checked with
stand-ins for the two torch calls and the library runner.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rillet.graphs.aot import step


def test_the_tile_state_is_asked_for_before_the_library_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def init_amx() -> bool:
        calls.append("init_amx")
        return True

    class Runner:
        def __init__(self, path: str, threads: int) -> None:
            calls.append("load")

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_init_amx", init_amx)
    monkeypatch.setattr(torch._C._aoti, "AOTIModelContainerRunnerCpu", Runner)
    step.load_library(Path("unused.so"))
    assert calls == ["init_amx", "load"]


def test_without_amx_nothing_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_init_amx", lambda: pytest.fail("asked without AMX"))
    assert step.allow_amx() is False


def test_asking_on_this_cpu_is_harmless() -> None:
    """The real call: True exactly where the CPU has AMX tiles (and Linux grants them)."""
    assert step.allow_amx() == torch.cpu._is_amx_tile_supported()
