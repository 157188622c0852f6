"""The serving stack alone: the synthetic model (no compute, fixed step time) behind the real
scheduler, ring, dispatcher, SSE and JSON, at 1, 64 and 256 concurrent streams.

Per level, streaming and not: delivered tok/s (tokens the clients received, from usage, over the
client wall time) against the engine's rate (tokens it generated per second of engine busy time,
i.e. steps/s x active streams).
If the front end falls behind, the engine's ring fills or delivery lags the engine, and the ratio
drops below 1.

    .venv/bin/python bench/null_engine.py [--step-ms 5] [--streams 1 64 256] [--tokens 400]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import peak_rss_mib, table, write_json
from loadgen import run_level
from server_proc import RilletServer


def counters(srv: RilletServer) -> tuple[float, float, float]:
    steps = srv.metric("rillet_engine_steps_total") or srv.metric("rillet_engine_steps") or 0.0
    busy = srv.metric("rillet_engine_busy_seconds_total") or srv.metric("rillet_engine_busy_seconds") or 0.0
    tokens = srv.metric("rillet_generation_tokens_total") or 0.0
    return steps, busy, tokens


def level(srv: RilletServer, streams: int, tokens: int, stream: bool) -> dict[str, Any]:
    s0, b0, k0 = counters(srv)
    t0 = time.perf_counter()
    res = asyncio.run(run_level(srv.base_url, "synthetic", streams, streams, tokens, stream))
    wall = time.perf_counter() - t0
    s1, b1, k1 = counters(srv)
    steps, busy = s1 - s0, b1 - b0
    # The engine's rate: tokens it produced per second of its own busy time (steps/s x the streams
    # actually active in those steps, ramp-up included).
    engine_rate = (k1 - k0) / busy if busy > 0 else 0.0
    delivered = res.tokens / res.wall_s if res.wall_s > 0 else 0.0
    return {
        "streams": streams,
        "stream": stream,
        "delivered_tok_s": delivered,
        "engine_tok_s": engine_rate,
        "ratio": delivered / engine_rate if engine_rate else None,
        "steps_per_s": steps / busy if busy else None,
        "step_ms": busy / steps * 1000 if steps else None,
        "errors": res.errors,
        "wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--set", action="append", default=[], help="extra config overrides")
    ap.add_argument("--out", default="bench/out/null_engine.json")
    a = ap.parse_args()
    top = max(a.streams)
    overrides = [
        "model.kind=synthetic",
        f"model.synthetic_step_ms={a.step_ms}",
        f"scheduler.max_num_seqs={top}",
        f"scheduler.max_num_batched_tokens={max(2048, top * 64)}",
        f"scheduler.max_waiting={max(1024, 2 * top)}",
        "logging.level=WARNING",
        *a.set,
    ]
    rows = []
    with RilletServer(overrides) as srv:
        asyncio.run(run_level(srv.base_url, "synthetic", 4, 8, 16, True))  # warm-up
        for n in a.streams:
            for stream in (True, False):
                rows.append(level(srv, n, a.tokens, stream))
                print(f"  streams={n} stream={stream}: ratio {rows[-1]['ratio']}", flush=True)
        rss = srv.peak_rss_mib()
    for n in a.streams:
        s = next(r for r in rows if r["streams"] == n and r["stream"])
        ns = next(r for r in rows if r["streams"] == n and not r["stream"])
        s["stream_vs_nonstream"] = (
            s["delivered_tok_s"] / ns["delivered_tok_s"] if ns["delivered_tok_s"] else None
        )
    write_json(
        a.out,
        {
            "step_ms": a.step_ms,
            "tokens": a.tokens,
            "rows": rows,
            "server_peak_rss_mib": rss,
            "client_peak_rss_mib": peak_rss_mib(),
        },
    )
    print(f"server peak RSS {rss} MiB; step {a.step_ms} ms; {a.tokens} tokens per request")
    cols = [
        "streams",
        "stream",
        "delivered_tok_s",
        "engine_tok_s",
        "ratio",
        "step_ms",
        "stream_vs_nonstream",
        "errors",
    ]
    print(table(rows, cols))


if __name__ == "__main__":
    main()
