"""A small async load generator for OpenAI-compatible servers (aiohttp, raw SSE parsing).

Lighter than the official client, so that at 256 concurrent streams on 2 cores the client does not
become the bottleneck it is measuring. Tokens are counted from `usage` (stream_options
include_usage), so coalesced events are not miscounted; per-token inter-token latency spreads an
event's gap over the tokens it carried (counted with the model's tokenizer when one is given).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson


@dataclass
class RequestResult:
    ok: bool
    tokens: int = 0
    ttft: float | None = None  # seconds to the first content event
    latency: float = 0.0  # seconds to the last byte
    itl: list[float] = field(default_factory=list)  # per-token gaps after the first token
    error: str | None = None


@dataclass
class LevelResult:
    concurrency: int
    stream: bool
    requests: int
    errors: int
    wall_s: float
    tokens: int
    ttft: list[float]
    itl: list[float]
    tpot: list[float]
    latencies: list[float] = field(default_factory=list)  # per request, seconds to its last byte

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


async def one_request(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    count_tokens: Callable[[str], int] | None,
) -> RequestResult:
    t0 = time.perf_counter()
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                return RequestResult(False, error=f"HTTP {resp.status}: {(await resp.text())[:200]}")
            if not body.get("stream"):
                data = orjson.loads(await resp.read())
                t = time.perf_counter() - t0
                return RequestResult(True, data["usage"]["completion_tokens"], t, t)
            return await _read_stream(resp, t0, count_tokens)
    except (TimeoutError, aiohttp.ClientError) as exc:
        return RequestResult(False, error=f"{type(exc).__name__}: {exc}")


async def _read_stream(
    resp: aiohttp.ClientResponse, t0: float, count_tokens: Callable[[str], int] | None
) -> RequestResult:
    res = RequestResult(True)
    last = None
    counted = 0
    buf = b""
    async for chunk in resp.content.iter_any():
        now = time.perf_counter()
        buf += chunk
        *events, buf = buf.split(b"\n\n")
        for ev in events:
            if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                continue
            data = orjson.loads(ev[6:])
            if "error" in data:
                return RequestResult(False, error=str(data["error"].get("message")))
            if data.get("usage") and not data.get("choices"):
                res.tokens = data["usage"]["completion_tokens"]
                continue
            text = _delta_text(data)
            if not text:
                continue
            k = max(1, count_tokens(text)) if count_tokens else 1
            counted += k
            if last is None:
                res.ttft = now - t0
            else:
                res.itl.extend([(now - last) / k] * k)
            last = now
    res.latency = time.perf_counter() - t0
    if not res.tokens:  # no usage chunk (a server without include_usage): count what arrived
        res.tokens = counted
    return res


def _delta_text(data: dict[str, Any]) -> str:
    choices = data.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    if "delta" in c:
        return str(c["delta"].get("content") or "")
    return str(c.get("text") or "")


def chat_body(model: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def run_level(
    base_url: str,
    model: str,
    concurrency: int,
    num_requests: int,
    max_tokens: int,
    stream: bool,
    prompt: str = "Write a long story about a lighthouse keeper.",
    count_tokens: Callable[[str], int] | None = None,
    headers: dict[str, str] | None = None,
    warm: bool = False,
    on_start: Callable[[], None] | None = None,
) -> LevelResult:
    """`warm`: first open `concurrency` keep-alive connections with 1-token requests (untimed), so
    the timed part measures serving, not TCP connects (production clients keep connections).
    `on_start` runs just before the clock starts (after the warm-up), e.g. to read server counters."""
    url = base_url.rstrip("/") + "/chat/completions"
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(num_requests):
        queue.put_nowait(i)
    results: list[RequestResult] = []
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout, headers=headers) as session:

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                body = chat_body(model, f"{prompt} (#{i})", max_tokens, stream)
                results.append(await one_request(session, url, body, count_tokens))

        if warm:
            await asyncio.gather(
                *(
                    one_request(session, url, chat_body(model, prompt, 1, False), None)
                    for _ in range(concurrency)
                )
            )
        if on_start is not None:
            on_start()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    ok = [r for r in results if r.ok]
    tpot = [
        (r.latency - r.ttft) / (r.tokens - 1) for r in ok if r.ttft is not None and r.tokens > 1 and stream
    ]
    return LevelResult(
        concurrency,
        stream,
        len(results),
        len(results) - len(ok),
        wall,
        sum(r.tokens for r in ok),
        [r.ttft for r in ok if r.ttft is not None],
        [x for r in ok for x in r.itl],
        tpot,
        [r.latency for r in ok],
    )


def summarize(s: LevelResult, ns: LevelResult | None) -> dict[str, Any]:
    ms = 1000.0
    row: dict[str, Any] = {
        "concurrency": s.concurrency,
        "tok_s": s.tok_s,
        "ttft_p50_ms": (pct(s.ttft, 50) or 0) * ms,
        "ttft_p99_ms": (pct(s.ttft, 99) or 0) * ms,
        "itl_p50_ms": (pct(s.itl, 50) or 0) * ms,
        "itl_p99_ms": (pct(s.itl, 99) or 0) * ms,
        "tpot_ms": statistics.mean(s.tpot) * ms if s.tpot else None,
        "errors": s.errors + (ns.errors if ns else 0),
    }
    if ns is not None:
        row["nonstream_tok_s"] = ns.tok_s
        row["stream_eff"] = s.tok_s / ns.tok_s if ns.tok_s else None
    return row
