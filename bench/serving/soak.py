"""Soak: a `rillet serve` subprocess under constant load for minutes; errors, memory growth, KV pool.

    .venv/bin/python bench/soak.py --duration 180 --concurrency 32
    .venv/bin/python bench/soak.py --engine default --duration 180 --concurrency 8 --max-tokens 32

`--concurrency` workers loop over mixed requests (chat / completions, streaming or not, n = 1 or 2,
prompts shared or unique) until `--duration` seconds are up (loopback only, bounded in time and,
by `--max-requests`, in count). A `--drop-fraction` of streams is abandoned mid-way on purpose
(client disconnects; not errors). An error is any other non-200, a stream without [DONE] or with
an error event, or a token count that is not max_tokens x n. The server's RSS is sampled every 5 s;
growth is measured from the end of `--warmup` to the end (the prefix cache keeps filling the KV
pool with block keys until the pool is full: a few MiB for 4,096 blocks, bounded, but it counts as
growth until then; `--set cache.num_blocks=1024` fills it within the warm-up). Finally the KV pool
must be whole (/metrics: 0 blocks in use, nothing running, waiting or streaming) and SIGTERM must
exit 0.
Writes bench/out/soak.json; prints a table last.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.lib.common import table, write_json
from bench.lib.server_proc import RilletServer

ENGINES = {
    "synthetic": ["model.kind=synthetic", "model.synthetic_step_ms=5", "model.max_model_len=1024"],
    "default": ["model.max_model_len=1024", "model.num_threads=2"],
}
SHARED_PROMPTS = [f"Shared system prompt {i}: tell me about the weather in spring." for i in range(4)]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def make_body(rng: random.Random, model: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    prompt = (
        rng.choice(SHARED_PROMPTS) if rng.random() < 0.5 else f"unique {rng.random()} " * rng.randint(1, 8)
    )
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": rng.randint(max(1, max_tokens // 4), max_tokens),
        "n": 2 if rng.random() < 0.1 else 1,
        "temperature": rng.choice([0.0, 0.7]),
        "ignore_eos": True,
        "stream": rng.random() < 0.7,
    }
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    if rng.random() < 0.5:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**body, "prompt": prompt}


async def one(session: aiohttp.ClientSession, url: str, body: dict[str, Any], drop: bool) -> str:
    """-> "ok", "dropped" or an error description."""
    want = body["max_tokens"] * body["n"]
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            return f"HTTP {resp.status}: {(await resp.text())[:200]}"
        if not body["stream"]:
            data = orjson.loads(await resp.read())
            got = data["usage"]["completion_tokens"]
            return "ok" if got == want else f"tokens {got} != {want}"
        buf, events, usage = b"", 0, None
        async for chunk in resp.content.iter_any():
            buf += chunk
            *blocks, buf = buf.split(b"\n\n")
            for block in blocks:
                if block == b"data: [DONE]":
                    return "ok" if usage == want else f"stream usage {usage} != {want}"
                event = orjson.loads(block[6:])
                if "error" in event:
                    return f"error event: {event['error']}"
                if event.get("usage") and not event.get("choices"):
                    usage = event["usage"]["completion_tokens"]
                events += 1
                if drop and events >= 3:
                    return "dropped"  # leaving the `async with` closes the connection mid-stream
        return "stream ended without [DONE]"


async def load(args: argparse.Namespace, base: str, model: str) -> tuple[Counter[str], list[str], int]:
    outcomes: Counter[str] = Counter()
    errors: list[str] = []
    deadline = time.monotonic() + args.duration
    sent = 0
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)  # a dropped stream closes its socket

    async def worker(wid: int, session: aiohttp.ClientSession) -> None:
        nonlocal sent
        rng = random.Random(wid)
        while time.monotonic() < deadline and sent < args.max_requests:
            sent += 1
            path, body = make_body(rng, model, args.max_tokens)
            drop = body["stream"] and rng.random() < args.drop_fraction
            try:
                result = await one(session, base + path, body, drop)
            except (TimeoutError, aiohttp.ClientError) as exc:
                result = f"{type(exc).__name__}: {exc}"
            if result in ("ok", "dropped"):
                outcomes[result] += 1
            else:
                outcomes["error"] += 1
                if len(errors) < 20:
                    errors.append(result)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(i, session) for i in range(args.concurrency)))
    return outcomes, errors, sent


async def sample_rss(srv: RilletServer, until: float, samples: list[tuple[float, float]], t0: float) -> None:
    assert srv.proc is not None
    while time.monotonic() < until:
        code = srv.proc.poll()
        if code is not None:
            raise RuntimeError(f"the server exited ({code}) during the soak; see {srv.log_path}")
        samples.append((time.monotonic() - t0, rss_mib(srv.proc.pid)))
        await asyncio.sleep(5)


async def soak(args: argparse.Namespace, srv: RilletServer) -> dict[str, Any]:
    assert srv.proc is not None
    base = f"http://127.0.0.1:{srv.port}"
    async with aiohttp.ClientSession() as s, s.get(base + "/v1/models") as r:
        model = (await r.json())["data"][0]["id"]
    t0 = time.monotonic()
    samples: list[tuple[float, float]] = []
    sampler = asyncio.create_task(sample_rss(srv, t0 + args.duration, samples, t0))
    outcomes, errors, sent = await load(args, base, model)
    await sampler
    wall = time.monotonic() - t0
    samples.append((wall, rss_mib(srv.proc.pid)))
    warm = next(rss for t, rss in samples if t >= args.warmup)
    end = samples[-1][1]
    return {
        "model": model,
        "requests": sent,
        "ok": outcomes["ok"],
        "dropped_on_purpose": outcomes["dropped"],
        "errors": outcomes["error"],
        "error_samples": errors,
        "wall_s": wall,
        "rss_mib_start": samples[0][1],
        "rss_mib_after_warmup": warm,
        "rss_mib_end": end,
        "rss_mib_max": max(r for _, r in samples),
        "rss_growth_after_warmup": (end - warm) / warm,
        "rss_samples": samples,
    }


def wait_pool_whole(srv: RilletServer, timeout: float = 30) -> dict[str, float | None]:
    names = ["rillet_kv_blocks_used", "rillet_num_requests_running", "rillet_num_requests_waiting"]
    names.append("rillet_active_streams")
    deadline = time.monotonic() + timeout
    while True:
        values = {n: srv.metric(n) for n in names}
        if all(v == 0 for v in values.values()) or time.monotonic() > deadline:
            values["rillet_kv_blocks_total"] = srv.metric("rillet_kv_blocks_total")
            return values
        time.sleep(0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=180)
    ap.add_argument("--warmup", type=float, default=30)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-requests", type=int, default=1_000_000)
    ap.add_argument("--drop-fraction", type=float, default=0.05)
    ap.add_argument("--engine", choices=sorted(ENGINES), default="synthetic")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="server config override")
    ap.add_argument("--out", default="bench/out/soak.json")
    args = ap.parse_args()
    with RilletServer([*ENGINES[args.engine], *args.overrides]) as srv:
        result = asyncio.run(soak(args, srv))
        result["pool_at_end"] = wait_pool_whole(srv)
        assert srv.proc is not None
        srv.proc.terminate()
        result["exit_code_on_sigterm"] = srv.proc.wait(60)
    pool = result["pool_at_end"]
    result["pass"] = (
        result["errors"] == 0
        and result["rss_growth_after_warmup"] < 0.05
        and all(pool[k] == 0 for k in pool if k != "rillet_kv_blocks_total")
        and result["exit_code_on_sigterm"] == 0
    )
    write_json(args.out, {"args": vars(args), **result})
    for e in result["error_samples"]:
        print("error:", e)
    row = {
        "engine": args.engine,
        "conc": args.concurrency,
        "wall_s": result["wall_s"],
        "requests": result["requests"],
        "ok": result["ok"],
        "dropped": result["dropped_on_purpose"],
        "errors": result["errors"],
        "rss_warm_MiB": result["rss_mib_after_warmup"],
        "rss_end_MiB": result["rss_mib_end"],
        "growth_%": 100 * result["rss_growth_after_warmup"],
        "kv_used_end": pool["rillet_kv_blocks_used"],
        "exit": result["exit_code_on_sigterm"],
        "pass": result["pass"],
    }
    print(table([row], list(row)))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
