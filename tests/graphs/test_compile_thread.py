"""The background compile of the CPU decode step (graphs/compiled.py), with stand-in models: its
thread's priority and lifetime, and where `graphs.enabled: auto` times the compiled step against
eager (on the thread that polls, the model's own, never on the compile thread). Nothing here
compiles (mode "none": the "compiled" function is the model's own)."""

from __future__ import annotations

import threading

import pytest
import torch
from rillet.graphs.compiled import CompiledDecode
from rillet.graphs.interface import DecodeBatch


class _Clock:
    """A stand-in for time.perf_counter that only the fake steps below advance."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _FakeModel:
    def __init__(self, clock: _Clock, ms: float) -> None:
        self.clock, self.ms = clock, ms

    def prepare_decode(self, batch: DecodeBatch) -> None:
        pass

    def forward_decode(self, batch: DecodeBatch) -> torch.Tensor:
        self.clock.now += self.ms / 1e3
        return torch.zeros(batch.num_rows, 4)


@pytest.mark.parametrize(("compiled_ms", "kept"), [(5.0, True), (10.5, True), (12.0, False)])
def test_auto_keeps_the_compiled_step_unless_clearly_slower(
    compiled_ms: float, kept: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`graphs.enabled: auto` compares medians of interleaved calls and keeps the compiled step
    unless it is more than SLOWER_THAN_EAGER x eager: a check that runs beside a busy engine must
    not flip to eager on noise. A fake clock: no real timing."""
    from rillet.graphs import speed_check

    clock = _Clock()
    monkeypatch.setattr(speed_check.time, "perf_counter", clock)
    eager = _FakeModel(clock, 10.0)
    cd = CompiledDecode(
        eager, "none", max_blocks_per_seq=4, device=torch.device("cpu"), check_faster=True, with_batch_1=False
    )
    cd.fn = _FakeModel(clock, compiled_ms).forward_decode
    assert cd._faster(cd._warm.padding(2, 3)) is kept
    assert (cd.failed is None) is kept
    if not kept:
        assert "slower" in (cd.failed or "")


def test_compile_thread_runs_at_a_lower_priority() -> None:
    """The compile thread nices itself (Linux: per thread), so the steps that serve meanwhile
    are not slowed by a cold compile; the engine's own threads keep their priority."""
    import os

    from rillet.graphs.compile_thread import COMPILE_NICE, lower_this_threads_priority

    if not hasattr(os, "setpriority"):
        pytest.skip("no per-thread priorities here")
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: list[int] = []

    def body() -> None:
        lower_this_threads_priority()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [min(19, mine + COMPILE_NICE)]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


class _BlockingModel:
    """A model whose first forward blocks until released: a compile in flight."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.calls = 0

    def prepare_decode(self, batch: DecodeBatch) -> None:
        pass

    def forward_decode(self, batch: DecodeBatch) -> torch.Tensor:
        self.calls += 1
        self.entered.set()
        assert self.release.wait(30)
        return torch.zeros(batch.num_rows, 4)


def test_closing_mid_compile_waits_for_it_and_compiles_nothing_more() -> None:
    """The compile thread is not a daemon even when a daemon (the engine thread) starts it, so
    interpreter exit waits for it instead of cutting Inductor off (measured: exit status 134,
    "terminate called without an active exception"); stop() ends it after the phase in flight."""
    model = _BlockingModel()
    cd = CompiledDecode(
        model, "none", max_blocks_per_seq=4, device=torch.device("cpu"), check_faster=True, with_batch_1=True
    )
    starter = threading.Thread(target=cd.start, daemon=True)  # as the engine thread does
    starter.start()
    starter.join()
    assert model.entered.wait(30)
    assert cd._thread is not None and not cd._thread.daemon
    cd.stop()
    model.release.set()
    assert cd.wait(30)
    # the phase in flight finished; neither the speed check nor the batch-1 graph ran
    assert model.calls == 1 and not cd.ready and not cd.ready_1


class _ThreadModel:
    """Records the thread of every forward; its first forward (the compile) blocks until released."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.release = threading.Event()

    def prepare_decode(self, batch: DecodeBatch) -> None:
        pass

    def forward_decode(self, batch: DecodeBatch) -> torch.Tensor:
        if not self.threads:
            assert self.release.wait(30)
        self.threads.append(threading.get_ident())
        return torch.zeros(batch.num_rows, 4)


def _decode(model: _ThreadModel, with_batch_1: bool = True, check_faster: bool = True) -> CompiledDecode:
    return CompiledDecode(
        model,
        "none",
        max_blocks_per_seq=4,
        device=torch.device("cpu"),
        check_faster=check_faster,
        with_batch_1=with_batch_1,
    )


def test_auto_times_the_step_on_the_polling_thread_after_the_compile_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under auto both graphs compile on the compile thread; the timing against eager waits for
    poll() on the model's thread (the engine's, between steps) once the compile thread has ended:
    a forward on any other thread than the one that built the model ran 2.3x slower. A frozen
    clock: both paths time 0 ms, so the verdict is "no slower" whatever the machine does."""
    from rillet.graphs import compiled as compiled_mod

    monkeypatch.setattr(compiled_mod.time, "perf_counter", _Clock())
    model = _ThreadModel()
    cd = _decode(model)
    cd.start()
    cd.poll()  # compiling: nothing to do yet
    assert not cd.ready and not cd.wait(0)
    model.release.set()
    assert cd._thread is not None
    cd._thread.join(30)
    compile_thread = cd._thread.ident
    assert model.threads == [compile_thread, compile_thread]  # batch 2+, then batch 1
    assert not cd.ready and not cd.ready_1 and not cd.wait(0)  # nothing in use before the check
    cd.poll()
    assert cd.wait(0) and cd.ready and cd.ready_1 and cd.settled and cd.failed is None
    timed = model.threads[2:]
    assert timed and set(timed) == {threading.get_ident()}  # the check ran here, on the polling thread
    cd.poll()  # once only
    assert len(model.threads) == 2 + len(timed)


def test_a_synchronous_compile_checks_on_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """start(background=False) compiles on the caller's thread, which is then the model's: the
    check runs there, at once, and the caller's priority is left alone."""
    import os

    from rillet.graphs import compiled as compiled_mod

    monkeypatch.setattr(compiled_mod.time, "perf_counter", _Clock())
    model = _ThreadModel()
    model.release.set()
    cd = _decode(model, with_batch_1=False)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if hasattr(os, "getpriority") else 0
    cd.start(background=False)
    assert cd.wait(0) and cd.ready and not cd.ready_1 and cd.settled
    assert set(model.threads) == {threading.get_ident()}
    if hasattr(os, "getpriority"):
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


def test_closing_before_the_check_leaves_the_step_eager() -> None:
    model = _ThreadModel()
    model.release.set()
    cd = _decode(model)
    cd.start()
    assert cd._thread is not None
    cd._thread.join(30)
    cd.stop()  # the engine closes before it polled
    assert cd.wait(0) and not cd.ready and "closed" in (cd.failed or "")
    calls = len(model.threads)
    cd.poll()
    assert len(model.threads) == calls


def test_the_engine_polls_its_runner_on_its_own_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Engine._run calls runner.poll() on the engine thread, idle or stepping."""
    from rillet.core.config import config_from_dict
    from rillet.core.llm import LLM
    from rillet.core.runner.synthetic import SyntheticRunner
    from rillet.core.sampling_params import SamplingParams

    seen: list[int] = []
    monkeypatch.setattr(SyntheticRunner, "poll", lambda self: seen.append(threading.get_ident()))
    cfg = config_from_dict({"model": {"kind": "synthetic"}})
    with LLM(cfg) as llm:
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))
        engine_thread = llm.engine._thread
        assert engine_thread is not None
        assert seen and set(seen) == {engine_thread.ident}


def test_the_compile_shortens_the_gil_switch_interval_while_it_runs() -> None:
    """Dynamo and Inductor hold the GIL in Python for seconds: while the compile thread runs, the
    interpreter hands the GIL over every COMPILE_SWITCH_INTERVAL_S (not 5 ms), so the engine
    thread, which drops it in every torch op, is not held back by up to 5 ms each time."""
    import sys

    from rillet.graphs.compile_thread import COMPILE_SWITCH_INTERVAL_S

    seen: list[float] = []

    class Model(_ThreadModel):
        def forward_decode(self, batch: DecodeBatch) -> torch.Tensor:
            seen.append(sys.getswitchinterval())
            return super().forward_decode(batch)

    before = sys.getswitchinterval()
    model = Model()
    model.release.set()
    cd = _decode(model, check_faster=False)
    cd.start()
    assert cd.wait(30) and cd.ready and cd.ready_1
    assert cd._thread is not None
    cd._thread.join(30)
    assert seen == [COMPILE_SWITCH_INTERVAL_S] * 2
    assert sys.getswitchinterval() == before
