"""Clients that go away: their requests are aborted in the engine and the KV pool is whole again."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from http_helpers import post, wait_for
from rillet.http.background import BackgroundServer

LONG = {"max_tokens": 200, "ignore_eos": True}


def _idle(engine: Any) -> bool:
    s = engine.stats()
    return s.running == 0 and s.waiting == 0 and s.kv_blocks_used == 0


def test_fifty_clients_disconnect_mid_stream(synth_server: BackgroundServer) -> None:
    engine = synth_server.state.engine
    assert engine is not None
    wait_for(lambda: _idle(engine), what="engine idle before the test")
    url = synth_server.base_url + "/chat/completions"
    peak: list[int] = []
    generated0 = engine.stats().generated_tokens

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
            counts = await asyncio.gather(*(client(session, i) for i in range(50)))
        assert counts == [3] * 50

    asyncio.run(run())
    assert max(peak) > 0  # the streams did hold KV blocks while alive
    # Every stream stopped well before its 200 tokens: aborted, blocks back in the pool.
    wait_for(lambda: _idle(engine), timeout=10, what="KV pool whole again")
    assert engine.stats().generated_tokens - generated0 < 50 * 200 // 2
    disp = synth_server.state.dispatcher
    assert disp is not None and disp.active == 0
    resp = post(
        synth_server,
        "/v1/completions",
        {"model": engine.model_name, "prompt": "still there?", "max_tokens": 4},
    )
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 4


def test_non_streaming_client_disconnect_aborts(synth_server: BackgroundServer) -> None:
    engine = synth_server.state.engine
    assert engine is not None
    wait_for(lambda: _idle(engine), what="engine idle before the test")
    generated0 = engine.stats().generated_tokens

    async def run() -> None:
        body = {"model": engine.model_name, "prompt": "wait for me", "max_tokens": 240, "ignore_eos": True}
        async with aiohttp.ClientSession() as session:
            task = asyncio.ensure_future(session.post(synth_server.base_url + "/completions", json=body))
            await asyncio.sleep(0.05)
            assert engine.stats().running == 1
            task.cancel()  # closes the connection before any answer

    asyncio.run(run())
    wait_for(lambda: _idle(engine), timeout=10, what="aborted request gone")
    assert engine.stats().generated_tokens - generated0 < 240
