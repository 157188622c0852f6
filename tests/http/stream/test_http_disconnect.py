"""Clients that go away: their requests are aborted in the engine and the KV pool is whole again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from engine_hooks import hold_steps
from http_helpers import post, until, wait_for
from rillet.http.background import BackgroundServer

LONG = {"max_tokens": 200, "ignore_eos": True}
CLIENTS = 50
# Once every stream has this many tokens the engine is held until every client's abort is in: a
# client that reads 3 events (the first token alone, then <= 16 tokens per event) always finds
# them, and no stream can run to its end first, however slow the clients are on this machine.
HOLD_AT = 20


def _idle(engine: Any) -> bool:
    s = engine.stats()
    return s.running == 0 and s.waiting == 0 and s.kv_blocks_used == 0


def _count_aborts(engine: Any, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Counts the server's engine.abort calls (restored after the test: the engine is shared)."""
    ids: set[str] = set()
    inner = engine.abort

    def abort(request_id: str) -> None:
        ids.add(request_id)
        inner(request_id)

    monkeypatch.setattr(engine, "abort", abort)
    return lambda: len(ids)


def test_fifty_clients_disconnect_mid_stream(
    synth_server: BackgroundServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = synth_server.state.engine
    assert engine is not None
    wait_for(lambda: _idle(engine), what="engine idle before the test")
    url = synth_server.base_url + "/chat/completions"
    peak: list[int] = []
    generated0 = engine.stats().generated_tokens
    aborts = _count_aborts(engine, monkeypatch)
    taken0 = engine._inbox.taken

    def all_streams_far_enough(batch: Any) -> bool:  # on the engine thread: its state is stable
        return (
            engine._inbox.taken - taken0 >= CLIENTS
            and not engine.core.scheduler.waiting
            and all(len(s.output_ids) >= HOLD_AT for s in batch.seqs)
        )

    async def client(session: aiohttp.ClientSession, i: int) -> int:
        body = {
            "model": engine.model_name,
            "messages": [{"role": "user", "content": f"client {i}"}],
            "stream": True,
            **LONG,
        }
        resp = await session.post(url, json=body)
        assert resp.status == 200
        got = 0
        async for line in resp.content:
            if line.startswith(b"data: ") and b'"content"' in line:
                got += 1
                if got == 3:
                    break
        peak.append(engine.stats().kv_blocks_used)
        resp.close()  # drop the connection mid-stream
        return got

    async def run() -> None:
        # One connection per client, so closing a response really closes its socket.
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            counts = await asyncio.gather(*(client(session, i) for i in range(CLIENTS)))
        assert counts == [3] * CLIENTS

    with hold_steps(engine, until=lambda batch: aborts() >= CLIENTS, when=all_streams_far_enough):
        asyncio.run(run())
        wait_for(lambda: _idle(engine), timeout=30, what="KV pool whole again")
    assert aborts() == CLIENTS  # every client that went away had its request aborted
    assert max(peak) > 0  # the streams did hold KV blocks while alive
    # Every stream stopped well before its 200 tokens: aborted, blocks back in the pool.
    generated = engine.stats().generated_tokens - generated0
    print(f"disconnect: {generated} tokens generated for {CLIENTS} streams of 200")
    assert generated < CLIENTS * 200 // 2
    disp = synth_server.state.dispatcher
    assert disp is not None and disp.active == 0
    resp = post(
        synth_server,
        "/v1/completions",
        {"model": engine.model_name, "prompt": "still there?", "max_tokens": 4},
    )
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 4


def test_non_streaming_client_disconnect_aborts(
    synth_server: BackgroundServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = synth_server.state.engine
    assert engine is not None
    wait_for(lambda: _idle(engine), what="engine idle before the test")
    generated0 = engine.stats().generated_tokens
    aborts = _count_aborts(engine, monkeypatch)

    async def run() -> None:
        body = {"model": engine.model_name, "prompt": "wait for me", "max_tokens": 240, "ignore_eos": True}
        async with aiohttp.ClientSession() as session:
            task = asyncio.ensure_future(session.post(synth_server.base_url + "/completions", json=body))
            await until(lambda: engine.stats().running == 1, "the request running")
            task.cancel()  # closes the connection before any answer

    # Past 5 tokens the engine waits for the abort: the request cannot end on its own first.
    mid_generation = lambda batch: all(len(s.output_ids) >= 5 for s in batch.seqs)  # noqa: E731
    with hold_steps(engine, until=lambda batch: aborts() >= 1, when=mid_generation):
        asyncio.run(run())
        wait_for(lambda: _idle(engine), timeout=30, what="aborted request gone")
    assert aborts() == 1
    assert engine.stats().generated_tokens - generated0 < 240
