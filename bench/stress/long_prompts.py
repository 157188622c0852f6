"""Long prompts arriving while streams are served: every request completes, and how long the
streams stall. The null engine (asynchronous by default, with host work on the GIL: the GPU's
stand-in) streams `--streams` requests while long non-streamed requests (one token each) arrive
every `--every-ms`; each stream's gaps between two SSE events are recorded. A prompt tokenized
while holding the GIL, or parsed on the event loop, shows as a gap far above the step time.

    .venv/bin/python -m bench.stress.long_prompts
    .venv/bin/python -m bench.stress.long_prompts --prompt-kib 0 6 24 96 --streams 16

Prints a table last (a row per prompt size; 0 = no long prompts) and writes JSON with the
server's peak RSS. Exit status 1 if any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

import aiohttp

from bench.lib.common import add_pinning, pin_client, table, write_json
from bench.lib.loadgen import chat_body
from bench.lib.server_proc import RilletServer
from bench.serving.null_engine import null_engine_overrides

WORDS = "the keeper of the lighthouse wrote down each night what the sea had brought ashore "


async def stream_gaps(session: aiohttp.ClientSession, url: str, tokens: int) -> list[float]:
    """Seconds between consecutive SSE events of one streamed request (after its first)."""
    gaps: list[float] = []
    last = None
    async with session.post(url, json=chat_body("synthetic", "go", tokens, True)) as resp:
        if resp.status != 200:
            raise RuntimeError(f"stream: HTTP {resp.status}: {(await resp.text())[:200]}")
        async for chunk in resp.content.iter_any():
            if b'"error"' in chunk:
                raise RuntimeError(f"stream: an error event: {chunk[:200]!r}")
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now
    return gaps


async def long_prompts(
    session: aiohttp.ClientSession, url: str, kib: int, every_s: float, done: asyncio.Event
) -> int:
    if kib == 0:
        return 0
    sent = 0
    prompt = (WORDS * (kib * 1024 // len(WORDS) + 1))[: kib * 1024]
    while not done.is_set():
        body = chat_body("synthetic", f"{sent} {prompt}", 1, False)
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"long prompt: HTTP {resp.status}: {(await resp.text())[:200]}")
            await resp.read()
        sent += 1
        await asyncio.sleep(every_s)
    return sent


async def one_level(base_url: str, streams: int, tokens: int, kib: int, every_s: float) -> dict[str, Any]:
    url = base_url + "/chat/completions"
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as session:
        done = asyncio.Event()
        sender = asyncio.create_task(long_prompts(session, url, kib, every_s, done))
        per_stream = await asyncio.gather(*(stream_gaps(session, url, tokens) for _ in range(streams)))
        done.set()
        sent = await sender
    gaps = sorted(g for s in per_stream for g in s)
    return {
        "prompt_kib": kib,
        "long_requests": sent,
        "events": len(gaps),
        "median_gap_ms": 1e3 * statistics.median(gaps),
        "p99_gap_ms": 1e3 * gaps[int(0.99 * (len(gaps) - 1))],
        "p999_gap_ms": 1e3 * gaps[int(0.999 * (len(gaps) - 1))],
        "max_gap_ms": 1e3 * gaps[-1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-kib", type=int, nargs="+", default=[0, 6, 24, 96])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=600)
    ap.add_argument("--every-ms", type=float, default=50.0, help="pause between two long requests")
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--host-ms", type=float, default=1.0, help="the engine's GIL-held host work a step")
    ap.add_argument("--sync", action="store_true", help="the synchronous null engine instead")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides")
    add_pinning(ap)
    ap.add_argument("--out", default="bench/out/long_prompts.json")
    a = ap.parse_args()
    cpus = pin_client(a)
    prompt_tokens = max(a.prompt_kib) * 1024 // 4 + 256
    overrides = [
        *null_engine_overrides(a.streams + 2, a.tokens, a.step_ms, prompt_tokens),
        f"model.max_model_len={prompt_tokens + a.tokens + 64}",
        *a.set,
    ]
    if not a.sync:
        overrides += ["model.synthetic_async=true", f"model.synthetic_host_ms={a.host_ms}"]
    rows: list[dict[str, Any]] = []
    with RilletServer(overrides, cpus=cpus) as srv:
        try:
            asyncio.run(one_level(srv.base_url, 4, 16, 0, 1.0))  # warm-up
            for kib in a.prompt_kib:
                rows.append(asyncio.run(one_level(srv.base_url, a.streams, a.tokens, kib, a.every_ms / 1000)))
                print(f"  {kib} KiB: max gap {rows[-1]['max_gap_ms']:.1f} ms", flush=True)
        except RuntimeError as exc:
            print(f"FAILED: {exc}")
            sys.exit(1)
        rss = srv.peak_rss_mib()
    write_json(a.out, {"args": vars(a), "server_peak_rss_mib": rss, "rows": rows})
    engine = "synchronous" if a.sync else f"asynchronous, {a.host_ms} ms host a step"
    print(
        f"null engine ({engine}), {a.step_ms} ms steps, {a.streams} streams x {a.tokens} tokens; "
        f"server peak RSS {rss} MiB"
    )
    cols = [
        "prompt_kib",
        "long_requests",
        "events",
        "median_gap_ms",
        "p99_gap_ms",
        "p999_gap_ms",
        "max_gap_ms",
    ]
    print(table(rows, cols))


if __name__ == "__main__":
    main()
