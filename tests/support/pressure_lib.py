"""Many concurrent long greedy requests; their texts, to compare a starved KV pool with a roomy one.

Shared by tests/reliability/test_kv_pressure.py and tests/stress/kv_pressure.py.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
from engine_hooks import count_calls, hold_first_step  # tests/: on the path via rel_helpers
from rel_helpers import COMP, fetch, send, stream_text

__all__ = ["count_calls", "hold_first_step", "make_requests", "run_all"]


def make_requests(num: int, seed: int, max_tokens: int, vocab: int = 5000) -> list[dict[str, Any]]:
    """Greedy completions with distinct token-id prompts (8-40 tokens); every other one streams."""
    rng = random.Random(seed)
    return [
        {
            "prompt": [rng.randrange(1, vocab) for _ in range(rng.randint(8, 40))],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": i % 2 == 1,
        }
        for i in range(num)
    ]


async def _one(port: int, body: dict[str, Any]) -> str:
    if not body["stream"]:
        status, data = await fetch(port, COMP, body)
        assert status == 200, data[:300]
        choice = orjson.loads(data)["choices"][0]
        assert choice["finish_reason"] == "length", choice
        return str(choice["text"])
    raw = await send(port, COMP, body)
    try:
        await raw.read_head()
        assert raw.status == 200, raw.status
        events = [e async for _, e in raw.events()]
    finally:
        raw.close()
    assert events[-1] == "[DONE]" and all("error" not in e for e in events[:-1]), events[-3:]
    return stream_text(events)[0]


async def run_all(port: int, model: str, requests: list[dict[str, Any]], timeout: float) -> list[str]:
    """All at once; the texts in request order."""
    bodies = [{**r, "model": model} for r in requests]
    return await asyncio.wait_for(asyncio.gather(*(_one(port, b) for b in bodies)), timeout)
