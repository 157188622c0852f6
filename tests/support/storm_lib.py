"""A disconnect storm: many concurrent requests, each dropped at a random point in its life.

Points: before the body is complete, right after sending, after the response head, after k SSE
events (FIN or RST), a non-streaming request abandoned mid-generation; a few run to the end as a
control. Shared by tests/reliability/test_disconnect_storm.py and tests/stress/disconnect_storm.py.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import orjson
from rel_helpers import CHAT, COMP, connect, request_bytes, send

MODES = ("partial_body", "after_send", "after_head", "events_fin", "events_rst", "nonstream", "complete")


def _body(rng: random.Random, model: str, i: int, stream: bool) -> tuple[str, dict[str, Any]]:
    common = {
        "model": model,
        "max_tokens": rng.randint(100, 200),
        "ignore_eos": True,
        "stream": stream,
        "n": rng.choice((1, 1, 1, 2)),
    }
    if rng.random() < 0.5:
        return CHAT, {**common, "messages": [{"role": "user", "content": f"storm {i} {rng.random()}"}]}
    return COMP, {**common, "prompt": f"storm {i} " * rng.randint(1, 20)}


def requested_tokens(num: int, seed: int) -> int:
    """Tokens the storm's requests ask for in all (max_tokens x n), by replaying its plan."""
    total = 0
    for i, r, mode in _plan(num, seed):
        _, body = _body(r, "m", i, stream=mode != "nonstream")
        total += body["max_tokens"] * body["n"]
    return total


def _plan(num: int, seed: int) -> list[tuple[int, random.Random, str]]:
    rng = random.Random(seed)
    return [(i, random.Random(rng.random()), rng.choice(MODES)) for i in range(num)]


async def _one(port: int, model: str, i: int, rng: random.Random, mode: str) -> str:
    path, body = _body(rng, model, i, stream=mode != "nonstream")
    if mode == "partial_body":
        raw = await connect(port)
        data = orjson.dumps(body)
        whole = request_bytes("POST", path, data)
        raw.writer.write(whole[: len(whole) - rng.randint(1, len(data))])
        await raw.writer.drain()
        await asyncio.sleep(rng.random() * 0.02)
        raw.close()
        return mode
    raw = await send(port, path, body)
    try:
        if mode == "after_send":
            await asyncio.sleep(rng.random() * 0.01)
            return mode
        if mode == "nonstream":
            await asyncio.sleep(rng.random() * 0.1)
            return mode
        await raw.read_head()
        assert raw.status == 200, raw.status
        if mode == "after_head":
            return mode
        stop_after = rng.randint(1, 60) if mode != "complete" else None
        seen = 0
        async for _, event in raw.events():
            seen += 1
            if stop_after is not None and seen >= stop_after:
                break
            if event == "[DONE]":
                return "complete"  # the stream ended before its drop point
            assert "error" not in event, event
        return mode
    finally:
        if mode == "events_rst":
            raw.reset()
        else:
            raw.close()


async def storm(port: int, model: str, num: int, seed: int, concurrency: int = 256) -> Counter[str]:
    """Runs `num` requests, at most `concurrency` at once; returns how each one ended.

    Prompts fit a 512-token context. Dropped requests asked for 100-200 tokens each, so a server
    that did not abort them would generate several times what one that does generates.
    """
    plan = _plan(num, seed)
    gate = asyncio.Semaphore(concurrency)

    async def run(i: int, r: random.Random, mode: str) -> str:
        async with gate:
            return await _one(port, model, i, r, mode)

    results = await asyncio.wait_for(asyncio.gather(*(run(*p) for p in plan)), timeout=30 + num * 0.2)
    return Counter(results)
