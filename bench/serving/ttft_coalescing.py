"""Is the first token delayed by event coalescing? TTFT with the default coalescing vs. coalescing off.

Three servers on the same model run side by side: `default` (stream.max_tokens_per_event as
configured, 16), `off` (max_tokens_per_event=1: one event per token) and `control`, a second
default server: default vs control is an A/A comparison that shows how far two identical servers
differ here, i.e. the noise floor of default vs off. An idle server costs no CPU, so the levels
rotate between them and all see the same machine state.
Target (issue 4): TTFT p50 with default coalescing within 5 % of coalescing off.

    .venv/bin/python bench/ttft_coalescing.py [--concurrency 1 8] [--rounds 5] [--set model.x=y]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
from typing import Any

from bench.lib.common import table, write_json
from bench.lib.loadgen import LevelResult, pct, run_level
from bench.lib.server_proc import RilletServer
from bench.serving.serve_sweep import served_model

MODES = {"default": [], "off": ["stream.max_tokens_per_event=1"], "control": []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=5, help="alternations per level (each: both servers)")
    ap.add_argument("--requests", type=int, default=4, help="requests per round = concurrency x this")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--set", action="append", default=[], help="config override for both servers")
    ap.add_argument("--out", default="bench/out/ttft_coalescing.json")
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(RilletServer([*a.set, *sets])) for name, sets in MODES.items()}
        names = list(servers)
        models = {name: served_model(srv.base_url, "auto") for name, srv in servers.items()}
        for name, srv in servers.items():  # warm-up: first requests pay one-time costs
            asyncio.run(run_level(srv.base_url, models[name], 2, 4, 8, True))
        for c in a.concurrency:
            got: dict[str, list[LevelResult]] = {name: [] for name in names}
            for r in range(a.rounds):
                for name in names[r % 3 :] + names[: r % 3]:  # rotate who goes first
                    url = servers[name].base_url
                    # Fresh prompts per round (each server sees them once): no prefix-cache hits.
                    prompt = f"Write a long story about a lighthouse keeper, take {c}-{r}."
                    n = c * a.requests
                    level = run_level(url, models[name], c, n, a.max_tokens, True, prompt=prompt, warm=True)
                    got[name].append(asyncio.run(level))
            level_rows = {name: row(name, c, got[name]) for name in names}
            off = level_rows["off"]["ttft_p50_ms"]
            for name in ("default", "control"):
                level_rows[name]["ttft_p50_vs_off"] = level_rows[name]["ttft_p50_ms"] / off if off else None
            rows += level_rows.values()
            d, k = level_rows["default"], level_rows["control"]
            ratios = f"default/off {d['ttft_p50_vs_off']:.3f}, control/off {k['ttft_p50_vs_off']:.3f}"
            print(f"  c={c}: TTFT p50 {ratios}", flush=True)
        rss = {name: srv.peak_rss_mib() for name, srv in servers.items()}
    write_json(a.out, {"rows": rows, "server_peak_rss_mib": rss, "max_tokens": a.max_tokens})
    print(f"server peak RSS (MiB): {rss}")
    cols = [
        "coalescing",
        "concurrency",
        "requests",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "ttft_mean_ms",
        "ttft_p50_vs_off",
    ]
    print(table(rows, [*cols, "events_per_token", "tok_s", "errors"]))


def row(name: str, c: int, runs: list[LevelResult]) -> dict[str, Any]:
    ttft = [t for r in runs for t in r.ttft]
    tokens = sum(r.tokens for r in runs)
    events = sum(len(r.itl) + len(r.ttft) for r in runs)  # itl has one entry per event after the first
    return {
        "coalescing": name,
        "concurrency": c,
        "requests": sum(r.requests for r in runs),
        "ttft_p50_ms": (pct(ttft, 50) or 0) * 1000,
        "ttft_p99_ms": (pct(ttft, 99) or 0) * 1000,
        "ttft_mean_ms": statistics.mean(ttft) * 1000 if ttft else None,
        "events_per_token": events / tokens if tokens else None,
        "tok_s": tokens / sum(r.wall_s for r in runs),
        "errors": sum(r.errors for r in runs),
    }


if __name__ == "__main__":
    main()
