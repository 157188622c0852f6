"""Concurrency sweep against one or more OpenAI-compatible endpoints, streaming and not.

Per level: output tok/s, TTFT p50/p99, inter-token latency p50/p99 (per token), TPOT, streaming
efficiency (streaming tok/s / non-streaming tok/s) and errors. Prints a table last, writes JSON
and a PNG plot comparing the endpoints.

    # against running servers (name=url):
    .venv/bin/python bench/serve_sweep.py --endpoint rillet=http://127.0.0.1:8000/v1 \\
        --endpoint llama.cpp=http://127.0.0.1:8080/v1 --concurrency 1 4 16 64 256
    # or let it start rillet itself, with config overrides:
    .venv/bin/python bench/serve_sweep.py --start-rillet --set model.kind=synthetic
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from bench.lib.common import table, write_json
from bench.lib.loadgen import run_level, summarize
from bench.lib.server_proc import RilletServer

COLS = [
    "endpoint",
    "concurrency",
    "tok_s",
    "nonstream_tok_s",
    "stream_eff",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "tpot_ms",
    "errors",
]


def token_counter() -> Any:
    from rillet.core.loaders.default_model import default_model_path
    from rillet.core.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(default_model_path())
    return lambda text: len(tok.encode(text, add_special_tokens=False))


def served_model(url: str, wanted: str) -> str:
    """`auto` = the first model the endpoint lists."""
    if wanted != "auto":
        return wanted
    import urllib.request

    with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=10) as r:
        return str(json.loads(r.read())["data"][0]["id"])


async def sweep(name: str, url: str, a: argparse.Namespace, count: Any) -> list[dict[str, Any]]:
    rows = []
    model = served_model(url, a.model)
    for c in a.concurrency:
        n = max(a.min_requests, c * a.rounds)
        await run_level(url, model, min(c, 4), min(n, 8), 8, True, count_tokens=count)  # warm-up
        s = await run_level(url, model, c, n, a.max_tokens, True, count_tokens=count)
        ns = await run_level(url, model, c, n, a.max_tokens, False)
        row = {"endpoint": name, **summarize(s, ns)}
        rows.append(row)
        print(
            f"  {name} c={c}: {row['tok_s']:.1f} tok/s stream, eff {row.get('stream_eff') or 0:.3f}",
            flush=True,
        )
    return rows


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name in dict.fromkeys(r["endpoint"] for r in rows):
        rs = [r for r in rows if r["endpoint"] == name]
        xs = [r["concurrency"] for r in rs]
        axes[0].plot(xs, [r["tok_s"] for r in rs], marker="o", label=f"{name} stream")
        axes[0].plot(xs, [r["nonstream_tok_s"] for r in rs], marker="x", ls="--", label=f"{name} non-stream")
        axes[1].plot(xs, [r["ttft_p50_ms"] for r in rs], marker="o", label=name)
        axes[2].plot(xs, [r["itl_p50_ms"] for r in rs], marker="o", label=name)
    for ax, title in zip(axes, ["output tok/s", "TTFT p50 (ms)", "ITL p50 (ms)"], strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoint", action="append", default=[], help="name=base_url (repeatable)")
    ap.add_argument("--start-rillet", action="store_true", help="start a rillet server for the sweep")
    ap.add_argument("--set", action="append", default=[], help="config override for --start-rillet")
    ap.add_argument("--model", default="auto", help="model name to request; auto = the first listed")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="requests per level = concurrency x rounds")
    ap.add_argument("--min-requests", type=int, default=4)
    ap.add_argument(
        "--include",
        action="append",
        default=[],
        help="a previous run's JSON: its rows for endpoints not measured now join the table and plot",
    )
    ap.add_argument("--out", default="bench/out/serve_sweep.json")
    a = ap.parse_args()
    count = token_counter()
    rows: list[dict[str, Any]] = []
    rss: dict[str, float | None] = {}
    endpoints = [e.split("=", 1) for e in a.endpoint]
    if a.start_rillet:
        with RilletServer(a.set) as srv:
            rows += asyncio.run(sweep("rillet", srv.base_url, a, count))
            rss["rillet"] = srv.peak_rss_mib()
    for name, url in endpoints:
        rows += asyncio.run(sweep(name, url, a, count))
    for path in a.include:
        measured = {r["endpoint"] for r in rows}
        old = json.loads(Path(path).read_text())
        rows += [{**r, "from": path} for r in old["rows"] if r["endpoint"] not in measured]
    png = str(Path(a.out).with_suffix(".png"))
    plot(rows, png)
    write_json(a.out, {"rows": rows, "server_peak_rss_mib": rss, "plot": png, "max_tokens": a.max_tokens})
    print(f"server peak RSS (MiB): {rss}   plot: {png}")
    print(table(rows, COLS))


if __name__ == "__main__":
    main()
