"""The client side of bench/serving/speculative.py: greedy chat completions through the `openai`
SDK (`one` request, streamed or not, counting its completion tokens; a `batch` of them from
concurrent clients, timed) and the server's speculation counters from /metrics
(`spec_counters`)."""

from __future__ import annotations

import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import openai


@dataclass
class Batch:
    wall_s: float
    tokens: int


def one(client: openai.OpenAI, model: str, prompt: str, stream: bool, max_tokens: int) -> int:
    kw: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    if not stream:
        r = client.chat.completions.create(**kw)
        return r.usage.completion_tokens if r.usage else 0
    tokens = chunks = 0
    for c in client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        if c.usage is not None:
            tokens = c.usage.completion_tokens
        elif c.choices and c.choices[0].delta.content:
            chunks += 1
    return tokens or chunks


def batch(
    clients: list[openai.OpenAI], model: str, prompts: list[str], stream: bool, max_tokens: int
) -> Batch:
    """Every client asks every prompt of the set in turn (client i starting at prompt i)."""
    counts = [0] * len(clients)
    start = threading.Barrier(len(clients) + 1)

    def work(i: int) -> None:
        start.wait()
        for j in range(len(prompts)):
            counts[i] += one(clients[i], model, prompts[(i + j) % len(prompts)], stream, max_tokens)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return Batch(time.perf_counter() - t0, sum(counts))


def spec_counters(base_url: str) -> tuple[float, float, float]:
    """(drafted, accepted, verify steps) from /metrics; zeros for a server without them."""
    root = base_url.rsplit("/v1", 1)[0]
    values = {"rillet_spec_draft_tokens_total": 0.0, "rillet_spec_accepted_tokens_total": 0.0}
    values["rillet_spec_verify_steps_total"] = 0.0
    try:
        with urllib.request.urlopen(f"{root}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                name = line.split(" ", 1)[0]
                if name in values:
                    values[name] = float(line.rsplit(" ", 1)[1])
    except OSError:
        pass
    return (
        values["rillet_spec_draft_tokens_total"],
        values["rillet_spec_accepted_tokens_total"],
        values["rillet_spec_verify_steps_total"],
    )
