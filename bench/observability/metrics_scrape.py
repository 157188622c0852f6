"""Is /metrics cheap? Its latency scraped every 50 ms (a fast Prometheus or endpoint picker) on the
default model server, idle and under a concurrent streaming load (issue 69: p99 under 20 ms in both).

    flock /work/cpu.lock .venv/bin/python -m bench.observability.metrics_scrape [--seconds 20] \\
        [--concurrency 16] [--max-tokens 64] [--interval-ms 50]

The scraper keeps one connection alive (as Prometheus does) and scrapes on a fixed 50 ms schedule
(a late scrape starts the next at once); latency is request sent to body read, on this machine's
2 cores shared with the server and the load's client. Under load it also records the Model Server
Protocol's gauges it reads (vllm:num_requests_running / _waiting, vllm:kv_cache_usage_perc), so
the table shows the load was there. Prints a table last, writes JSON (bench/out/metrics_scrape.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.request
from typing import Any

import aiohttp

from bench.lib.common import OUT, peak_rss_mib, table, write_json
from bench.lib.loadgen import pct, run_level
from bench.lib.server_proc import RilletServer

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def _gauges(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in GAUGES:
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


async def scrape(url: str, interval: float, stop: asyncio.Event, seconds: float | None) -> dict[str, Any]:
    """Scrapes until `stop` is set (or `seconds` pass); latencies in ms and the gauges' peaks."""
    lat: list[float] = []
    peaks = dict.fromkeys(GAUGES, 0.0)
    size = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        t0 = time.perf_counter()
        k = 0
        while not stop.is_set() and (seconds is None or time.perf_counter() - t0 < seconds):
            t = time.perf_counter()
            async with session.get(url) as r:
                body = await r.text()
                assert r.status == 200, r.status
            lat.append((time.perf_counter() - t) * 1000)
            size = len(body)
            for name, v in _gauges(body).items():
                peaks[name] = max(peaks[name], v)
            k += 1
            await asyncio.sleep(max(0.0, t0 + k * interval - time.perf_counter()))
    return {
        "scrapes": len(lat),
        "p50_ms": pct(lat, 50),
        "p99_ms": pct(lat, 99),
        "max_ms": max(lat),
        "body_bytes": size,
        "peak_running": peaks[GAUGES[0]],
        "peak_waiting": peaks[GAUGES[1]],
        "peak_kv_usage": peaks[GAUGES[2]],
    }


async def loaded(srv: RilletServer, a: argparse.Namespace, model: str) -> tuple[dict[str, Any], Any]:
    stop = asyncio.Event()
    url = f"http://127.0.0.1:{srv.port}/metrics"
    scraper = asyncio.create_task(scrape(url, a.interval_ms / 1000, stop, None))
    level = await run_level(
        srv.base_url, model, a.concurrency, a.requests, a.max_tokens, stream=True, warm=True
    )
    stop.set()
    return await scraper, level


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="of idle scraping")
    ap.add_argument("--interval-ms", type=float, default=50.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=64, help="of the load (its length)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--set", action="append", default=[], help="extra server overrides")
    ap.add_argument("--out", default=str(OUT / "metrics_scrape.json"))
    a = ap.parse_args()
    overrides = [f"scheduler.max_num_seqs={a.concurrency // 2}", *a.set]  # half wait: waiting > 0
    with RilletServer(overrides) as srv:
        url = f"http://127.0.0.1:{srv.port}/metrics"
        with urllib.request.urlopen(f"{srv.base_url}/models", timeout=10) as r:
            model = json.load(r)["data"][0]["id"]
        idle = asyncio.run(scrape(url, a.interval_ms / 1000, asyncio.Event(), a.seconds))
        under, level = asyncio.run(loaded(srv, a, model))
        server_rss = srv.peak_rss_mib()
        decode = srv.decode_path
    rows = [
        {"phase": "idle", **idle},
        {"phase": f"load c={a.concurrency}", **under, "load_tok_s": level.tok_s, "load_errors": level.errors},
    ]
    summary = {
        "interval_ms": a.interval_ms,
        "decode_path": decode,
        "target_p99_ms": 20.0,
        "server_peak_rss_mib": server_rss,
        "client_peak_rss_mib": peak_rss_mib(),
    }
    write_json(a.out, {"overrides": overrides, "rows": rows, "summary": summary})
    print(f"wrote {a.out}; decode step {decode}")
    print(f"peak RSS: server {server_rss or 0:.0f} MiB, client {summary['client_peak_rss_mib']:.0f} MiB")
    cols = ["phase", "scrapes", "p50_ms", "p99_ms", "max_ms", "body_bytes"]
    cols += ["peak_running", "peak_waiting", "peak_kv_usage", "load_tok_s", "load_errors"]
    print(table(rows, cols))


if __name__ == "__main__":
    main()
