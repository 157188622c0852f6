"""The multi-turn chat workload of bench/fleet/routing.py: conversations at once, a long system
prompt shared by all, long user turns whose history grows; streamed, usage included."""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import openai

from bench.lib.common import words

BLOCK = 16  # cache.block_size: prefix hits are whole blocks
@dataclass(frozen=True)
class Workload:
    conversations: int
    turns: int
    system_words: int
    user_words: int
    max_tokens: int


@dataclass
class Turn:
    conv: int
    turn: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float


async def _conversation(
    client: openai.AsyncOpenAI, model: str, wl: Workload, system: str, conv: int, seed: int
) -> list[Turn]:
    rng = random.Random(seed * 1000 + conv)
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    out = []
    for t in range(wl.turns):
        messages.append({"role": "user", "content": f"Chat {conv}, turn {t}: {words(rng, wl.user_words)}"})
        t0 = time.perf_counter()
        ttft, parts, usage = None, [], None
        stream = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=wl.max_tokens, temperature=0,  # type: ignore[arg-type]
            stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens or 0
        out.append(Turn(conv, t, usage.prompt_tokens, cached, usage.completion_tokens, ttft or 0.0))
        messages.append({"role": "assistant", "content": "".join(parts)})
    return out


def _blocks(tokens: int) -> int:
    """The tokens of a prompt a prefix cache can hold: whole blocks."""
    return tokens // BLOCK * BLOCK


def summarize(turns: list[Turn], system_tokens: int, wall: float) -> dict[str, Any]:
    by_conv: dict[int, list[Turn]] = {}
    for t in turns:
        by_conv.setdefault(t.conv, []).append(t)
    pairs = [(a, b) for ts in by_conv.values() for a, b in itertools.pairwise(ts)]
    ttfts = sorted(t.ttft_s * 1000 for t in turns)
    return {
        "turns": len(turns),
        "wall_s": round(wall, 2),
        "turns_s": len(turns) / wall,
        "tok_s": sum(t.completion_tokens for t in turns) / wall,
        "ttft_p50_ms": statistics.median(ttfts),
        "ttft_p90_ms": ttfts[int(0.9 * (len(ttfts) - 1))],
        "cached_frac": sum(t.cached_tokens for t in turns) / sum(t.prompt_tokens for t in turns),
        "history_hit": sum(b.cached_tokens >= _blocks(a.prompt_tokens) for a, b in pairs) / len(pairs),
        "system_hit": sum(b.cached_tokens >= _blocks(system_tokens) for _, b in pairs) / len(pairs),
        "per_turn_cached": [[t.cached_tokens, t.prompt_tokens] for t in turns],
    }


async def run_workload(base_url: str, wl: Workload, seed: int) -> dict[str, Any]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    system = "You are a patient assistant. " + words(random.Random(seed), wl.system_words)
    # the system prompt's own tokens (its chat-template framing included): one request's prompt_tokens
    probe = await client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": system}],
        max_tokens=1,  # type: ignore[arg-type]
    )
    system_tokens = probe.usage.prompt_tokens if probe.usage else 0
    t0 = time.perf_counter()
    convs = await asyncio.gather(
        *(_conversation(client, model, wl, system, c, seed) for c in range(wl.conversations))
    )
    wall = time.perf_counter() - t0
    await client.close()
    return {"system_tokens": system_tokens, **summarize([t for ts in convs for t in ts], system_tokens, wall)}
