"""The event loop giving way to the engine (stream.engine_first, core/engine/handoff/gil_gate.py): the
dispatcher asks the gate between its deliveries and writes; through a real server on the
asynchronous null engine, every probe gives the same streams as without a gate."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from http_helpers import SYNTH_OVERRIDES, post, serving, sse_events, until, wait_for
from rillet.core.config import load_config
from rillet.core.outputs import SeqDelta, StepOutput
from rillet.core.ring import SpscRing
from rillet.http.stream.dispatcher import GIVE_WAY_EVERY, Dispatcher
from rillet.http.stream.request_stream import RequestStream


class CountingGate:
    def __init__(self) -> None:
        self.calls = 0

    def give_way(self) -> bool:
        self.calls += 1
        return False


def test_the_dispatcher_asks_the_gate_between_deliveries() -> None:
    streams = 2 * GIVE_WAY_EVERY + 1

    async def scenario() -> tuple[int, list[int]]:
        ring: SpscRing[StepOutput] = SpscRing(16)
        gate = CountingGate()
        disp = Dispatcher(ring, lambda rid: None, 10_000, gate=gate)
        collected = [RequestStream(f"r{i}", 1) for i in range(streams)]
        for i, stream in enumerate(collected):
            disp.register(f"r{i}", stream)
        disp.attach(asyncio.get_running_loop())
        deltas = [SeqDelta(f"r{i}", 0, [7], "x", None, None, 3, 0, 1) for i in range(streams)]
        ring.push(StepOutput(1, deltas))
        await until(lambda: disp.steps_routed == 1, "the step routed")
        disp.detach()
        return gate.calls, [len(s.take()) for s in collected]

    calls, taken = asyncio.run(scenario())
    assert calls == -(-streams // GIVE_WAY_EVERY)  # once per GIVE_WAY_EVERY streams delivered
    assert taken == [1] * streams  # nobody was left out


def idle(engine: Any) -> bool:
    s = engine.stats()
    return s.running == 0 and s.waiting == 0 and s.kv_blocks_used == 0


@pytest.mark.parametrize(("probe", "depth"), [("device", 1), ("clock", 1), ("none", 1), ("none", 2)])
def test_streams_through_the_gate_equal_the_answers_without_streaming(probe: str, depth: int) -> None:
    """depth: engine.overlap_depth (2: the pairing that closed the null engine's gap at 256
    streams, bench/RESULTS.md)."""
    from rillet.core.engine.engine import Engine

    overrides = [
        *SYNTH_OVERRIDES,
        "stream.engine_first=on",
        f"stream.engine_first_probe={probe}",
        f"engine.overlap_depth={depth}",
    ]
    cfg = load_config(None, overrides)
    engine = Engine(cfg)
    engine.start()
    try:
        assert engine.gate is not None and engine.gate.probe_mode == probe
        assert engine.core.depth == depth

        def ask(i: int, stream: bool) -> str:
            body = {
                "model": engine.model_name,
                "messages": [{"role": "user", "content": f"story {i}"}],
                "max_tokens": 24 + i,
                "stream": stream,
            }
            r = post(srv, "/v1/chat/completions", body)
            assert r.status_code == 200, r.text
            if not stream:
                return str(r.json()["choices"][0]["message"]["content"])
            events = [e for e in sse_events(r.content) if e != "[DONE]"]
            return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])

        with serving(engine, cfg=cfg) as srv, ThreadPoolExecutor(16) as pool:
            assert srv.state.dispatcher is not None and not srv.state.dispatcher.write_last  # as formatted
            jobs = [(i, s) for i in range(12) for s in (True, False)]
            got = list(pool.map(lambda job: ask(*job), jobs))
        for i in range(12):
            assert got[2 * i] == got[2 * i + 1] and got[2 * i]
        wait_for(lambda: idle(engine), 30, "the engine idle, its pool whole")
    finally:
        engine.shutdown()
