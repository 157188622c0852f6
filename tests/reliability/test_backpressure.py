"""Back-pressure: a client that reads slowly or not at all costs the others nothing, and the server
holds at most `stream.max_buffered_tokens` of its output before cutting it off (logged)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import pytest
from rel_helpers import COMP, RawResponse, assert_all_released, assert_serves, median, send, served, wait_for
from rillet.http.background import BackgroundServer

CUT = ("model.synthetic_step_ms=1", "model.max_model_len=8192", "stream.max_buffered_tokens=64")
HUGE = {"prompt": "never read", "max_tokens": 6000, "ignore_eos": True, "stream": True}


async def _stalled(srv: BackgroundServer, model: str) -> RawResponse:
    """A stream whose client takes the head and then reads nothing (tiny receive buffers)."""
    raw = await send(srv.port, COMP, {**HUGE, "model": model}, rcvbuf=4096, limit=4096)
    await raw.read_head()
    assert raw.status == 200
    return raw


def _cut_logged(caplog: pytest.LogCaptureFixture) -> bool:
    return any("cut off" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_stalled_reader_is_cut_off_and_disconnected(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rillet.http.dispatcher")
    with served(*CUT) as (engine, srv):

        async def run() -> bytes:
            raw = await _stalled(srv, engine.model_name)
            await asyncio.to_thread(wait_for, lambda: _cut_logged(caplog), 30, "cut-off logged")
            # It still reads nothing: after the grace period the server drops the connection.
            await asyncio.to_thread(wait_for, lambda: srv.state.inflight == 0, 10, "handler gone")
            got = b""
            try:
                while chunk := await asyncio.wait_for(raw.reader.read(1 << 16), 5):
                    got += chunk
            except ConnectionResetError:
                pass
            raw.close()
            return got

        t0 = time.monotonic()
        got = asyncio.run(run())
        assert time.monotonic() - t0 < 20
        assert b"[DONE]" not in got  # cut, not finished
        # Aborted in the engine long before its 6,000 tokens: only what the socket absorbed + 64.
        assert engine.stats().generated_tokens < 3000
        assert_all_released(engine, srv)
        assert_serves(srv, engine.model_name)


def test_slow_reader_that_catches_up_gets_the_error_event(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rillet.http.dispatcher")
    with served(*CUT) as (engine, srv):

        async def run() -> list[Any]:
            raw = await _stalled(srv, engine.model_name)
            await asyncio.to_thread(wait_for, lambda: _cut_logged(caplog), 30, "cut-off logged")
            events = [e async for _, e in raw.events()]  # now it reads, well within the grace
            raw.close()
            return events

        events = asyncio.run(run())
        assert events[-1] == "[DONE]"
        assert events[-2]["error"]["code"] == "stream_buffer_full", events[-2]
        texts = [e["choices"][0]["text"] for e in events[:-2]]
        assert len(texts) > 100 and all(texts)  # what it read before the cut was intact
        assert_all_released(engine, srv)


# ---- inter-token latency of the others -------------------------------------------------------------

ITL = (
    "model.synthetic_step_ms=10",
    "model.max_model_len=1024",
    "scheduler.max_num_seqs=128",
    "stream.max_buffered_tokens=100000",  # the slow readers stay (slow) for the whole measurement
)
NORMAL = 8
EXTRA = 4  # streams of 8 choices each: read promptly (baseline) or slowly (the test)


async def _normal(port: int, model: str, i: int) -> float:
    body = {"model": model, "prompt": f"normal {i}", "max_tokens": 100, "ignore_eos": True, "stream": True}
    raw = await send(port, COMP, body)
    await raw.read_head()
    times = [t async for t, e in raw.events() if e != "[DONE]" and e["choices"][0]["text"]]
    raw.close()
    assert len(times) >= 90
    return median([b - a for a, b in itertools.pairwise(times)])


async def _extra(port: int, model: str, i: int, slow: bool, stop: asyncio.Event) -> None:
    body = {"model": model, "prompt": f"extra {i}", "max_tokens": 900, "n": 8, "ignore_eos": True}
    raw = await send(
        port, COMP, {**body, "stream": True}, rcvbuf=4096 if slow else None, limit=4096 if slow else 2**16
    )
    try:
        while not stop.is_set():
            if slow:
                await raw.reader.read(256)  # 5 KB/s against ~160 KB/s produced
                await asyncio.sleep(0.05)
            elif not await raw.reader.read(1 << 16):
                return
    finally:
        raw.close()


async def _trial(srv: BackgroundServer, model: str, slow: bool) -> float:
    """Median over the normal streams of their median inter-token latency, next to the extras."""
    stop = asyncio.Event()
    extras = [asyncio.create_task(_extra(srv.port, model, i, slow, stop)) for i in range(EXTRA)]
    await asyncio.sleep(1.0)  # slow extras: their sockets fill and their backlog starts growing
    itls = await asyncio.gather(*(_normal(srv.port, model, i) for i in range(NORMAL)))
    disp = srv.state.dispatcher
    assert disp is not None
    backlog = max((s.pending_tokens for s, _ in disp._routes.values()), default=0)
    stop.set()
    await asyncio.gather(*extras)
    if slow:
        assert backlog > 500, backlog  # the slow extras really were stuck behind full sockets
    return median(itls)


def test_slow_readers_leave_the_others_inter_token_latency_alone() -> None:
    with served(*ITL) as (engine, srv):
        model = engine.model_name
        ratios = []
        for _ in range(3):  # a loaded 2-core box is noisy: the best of three paired trials
            base = asyncio.run(_trial(srv, model, slow=False))
            assert_all_released(engine, srv)
            loaded = asyncio.run(_trial(srv, model, slow=True))
            assert_all_released(engine, srv)
            ratios.append(loaded / base)
            print(f"ITL median: baseline {base * 1e3:.2f} ms, beside slow readers {loaded * 1e3:.2f} ms")
            if ratios[-1] <= 1.10:
                break
        assert min(ratios) <= 1.10, ratios
        assert_serves(srv, model)
