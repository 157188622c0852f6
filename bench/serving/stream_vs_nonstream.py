"""Does streaming cost throughput? The seed issue's measurement, with the official `openai` client
(`--api chat`, the default, and `--api responses`) or the `anthropic` one (`--api messages`).

For each concurrency C, batches of C simultaneous chat requests (greedy, `--max-tokens` tokens,
ignore_eos so every request makes exactly that many) alternate between non-streaming and
streaming in ABBA order, so drift (thermal, other load) hits both alike. Tokens are counted from `usage`
(streams ask for it with stream_options.include_usage). The ratio is streaming tok/s over
non-streaming tok/s; 1.0 means streaming is free. Beside it, the pairs' geometric mean ratio with
its 95 % bootstrap interval (bench/lib/ratio_ci.py): a target inside the interval is not settled by
the run, whichever side of it the point fell (single pairs spread +-5-15 % on a shared 2-core VM).

    python -m bench.serving.stream_vs_nonstream              # starts `rillet serve` on the default model
    python -m bench.serving.stream_vs_nonstream --set model.kind=synthetic --set model.synthetic_step_ms=5
    python -m bench.serving.stream_vs_nonstream --base-url http://127.0.0.1:8000/v1 --model NAME
    # issue 25's method: server on core 0 with one torch thread, this client on core 1
    python -m bench.serving.stream_vs_nonstream --server-cpus 0 --client-cpus 1 \
        --set model.num_threads=1 --concurrency 1 8 64 --runs 8

Per batch it also reads the server's /metrics (when it has them): the engine's hand-off wait per
step (`rillet_handoff_wait_seconds` / `rillet_engine_steps`) and the dispatcher's CPU time; and
the event loop thread's CPU from /proc, split into user mode and the kernel's ("of which user"):
over loopback a `send` also runs the receiving side's TCP path and the client's wake-up in the
sender's kernel time, which a client on another host would not cost the server.
    python -m bench.serving.stream_vs_nonstream --api responses   # /v1/responses (semantic events)
    python -m bench.serving.stream_vs_nonstream --api messages    # /v1/messages (Anthropic events)

Prints a table last and writes JSON (with the server's peak RSS when this script started it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from dataclasses import asdict
from typing import Any

import openai

from bench.lib.common import add_pinning, pin_client, table, write_json
from bench.lib.ratio_ci import RatioCI, ratio_ci
from bench.lib.sdk_client import make_clients
from bench.lib.server_proc import RilletServer
from bench.lib.timed_batch import Batch, run_batch


def measure(
    base_url: str,
    model: str,
    api_key: str,
    concurrency: int,
    runs: int,
    max_tokens: int,
    server_pid: int | None = None,
    api: str = "chat",
    raw: bool = False,
) -> dict[str, Any]:
    clients = make_clients(base_url, api_key, api, concurrency, raw)
    run_batch(clients, model, False, 8, api=api)  # warm-up: first-request costs stay out of the numbers
    run_batch(clients, model, True, 8, api=api)
    plain: list[Batch] = []
    streamed: list[Batch] = []
    for i in range(runs):  # ABBA order: neither mode always goes first (prefix cache, drift)
        for stream in (False, True) if i % 2 == 0 else (True, False):
            batch = run_batch(clients, model, stream, max_tokens, server_pid, base_url, api)
            (streamed if stream else plain).append(batch)
    p_rate = sum(b.tokens for b in plain) / sum(b.wall_s for b in plain)
    s_rate = sum(b.tokens for b in streamed) / sum(b.wall_s for b in streamed)
    ttfts = [t for b in streamed for t in b.ttft_s]
    # Batch i of each mode ran back to back (ABBA), so their ratio cancels slow drift of the
    # machine's speed, which on a shared 2-core VM is ~10 % from one batch to the next.
    pairs = [(s.tokens / s.wall_s) / (p.tokens / p.wall_s) for p, s in zip(plain, streamed, strict=True)]

    def cpu_ms_per_token(batches: list[Batch], side: str) -> float | None:
        values = [getattr(b, side) for b in batches]
        if any(v is None for v in values):
            return None
        return 1000 * sum(values) / max(1, sum(b.tokens for b in batches))

    def ms_per_step(batches: list[Batch], side: str = "engine_wait_s") -> float | None:
        values, steps = [getattr(b, side) for b in batches], [b.engine_steps for b in batches]
        if any(v is None for v in values + steps):
            return None
        return (
            1000 * sum(v for v in values if v is not None) / max(1.0, sum(s for s in steps if s is not None))
        )

    return {
        "concurrency": concurrency,
        "runs": runs,
        "max_tokens": max_tokens,
        "nonstream_tok_s": p_rate,
        "stream_tok_s": s_rate,
        "ratio": s_rate / p_rate,
        "pair_ratios": pairs,
        "median_pair_ratio": statistics.median(pairs),
        # the pairs' geometric mean and its 95 % bootstrap interval (bench/lib/ratio_ci.py)
        "pair_ratio_ci95": asdict(ratio_ci(pairs)),
        "stream_chunks_per_token": sum(b.chunks for b in streamed) / max(1, sum(b.tokens for b in streamed)),
        "stream_mean_ttft_s": sum(ttfts) / len(ttfts),
        "client_cpu_ms_per_token": {
            "nonstream": cpu_ms_per_token(plain, "client_cpu_s"),
            "stream": cpu_ms_per_token(streamed, "client_cpu_s"),
        },
        "server_cpu_ms_per_token": {
            "nonstream": cpu_ms_per_token(plain, "server_cpu_s"),
            "stream": cpu_ms_per_token(streamed, "server_cpu_s"),
        },
        "server_loop_cpu_ms_per_token": {
            "nonstream": cpu_ms_per_token(plain, "loop_cpu_s"),
            "stream": cpu_ms_per_token(streamed, "loop_cpu_s"),
        },
        "server_loop_user_ms_per_token": {
            "nonstream": cpu_ms_per_token(plain, "loop_user_s"),
            "stream": cpu_ms_per_token(streamed, "loop_user_s"),
        },
        "dispatch_cpu_ms_per_token": {
            "nonstream": cpu_ms_per_token(plain, "dispatch_cpu_s"),
            "stream": cpu_ms_per_token(streamed, "dispatch_cpu_s"),
        },
        "engine_wait_ms_per_step": {
            "nonstream": ms_per_step(plain),
            "stream": ms_per_step(streamed),
        },
        # the engine thread's own CPU a step, and its time runnable but without a core: on a core
        # shared with the loop, streaming's cost shows in the second if it is the loop's work
        "engine_cpu_ms_per_step": {
            "nonstream": ms_per_step(plain, "engine_cpu_s"),
            "stream": ms_per_step(streamed, "engine_cpu_s"),
        },
        "engine_runq_ms_per_step": {
            "nonstream": ms_per_step(plain, "engine_runq_s"),
            "stream": ms_per_step(streamed, "engine_runq_s"),
        },
        "batches": {"nonstream": [asdict(b) for b in plain], "stream": [asdict(b) for b in streamed]},
    }


def _pair(d: dict[str, float | None], digits: int = 2) -> str:
    if d["nonstream"] is None or d["stream"] is None:
        return "-"
    return f"{d['nonstream']:.{digits}f} | {d['stream']:.{digits}f}"


def _minus_us(d: dict[str, float | None]) -> str:
    if d["nonstream"] is None or d["stream"] is None:
        return "-"
    return f"{1000 * (d['stream'] - d['nonstream']):.1f}"


def summary_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "concurrency": r["concurrency"],
            "non-stream tok/s": r["nonstream_tok_s"],
            "stream tok/s": r["stream_tok_s"],
            "ratio": r["ratio"],
            "pair ratios median [min, max]": "{:.3f} [{:.3f}, {:.3f}]".format(
                r["median_pair_ratio"], min(r["pair_ratios"]), max(r["pair_ratios"])
            ),
            "pairs' mean [95 % interval]": RatioCI(**r["pair_ratio_ci95"]).text(),
            "stream TTFT ms": r["stream_mean_ttft_s"] * 1000,
            "client CPU ms/tok N|S": _pair(r["client_cpu_ms_per_token"]),
            "server CPU ms/tok N|S": _pair(r["server_cpu_ms_per_token"]),
            "of which loop N|S": _pair(r["server_loop_cpu_ms_per_token"], 3),
            "loop S-N us/tok": _minus_us(r["server_loop_cpu_ms_per_token"]),
            "of which user": _minus_us(r["server_loop_user_ms_per_token"]),
            "engine wait ms/step N|S": _pair(r["engine_wait_ms_per_step"], 3),
            "engine CPU ms/step N|S": _pair(r["engine_cpu_ms_per_step"], 3),
            "engine runq ms/step N|S": _pair(r["engine_runq_ms_per_step"], 3),
        }
        for r in rows
    ]


def run_levels(base_url: str, args: argparse.Namespace, server_pid: int | None) -> list[dict[str, Any]]:
    model = args.model or openai.OpenAI(base_url=base_url, api_key=args.api_key).models.list().data[0].id
    if args.client_idle:  # after the server started: it keeps its own policy; threads inherit this
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    rows = []
    for c in args.concurrency:
        print(f"concurrency {c} ...", file=sys.stderr)
        row = measure(
            base_url,
            model,
            args.api_key,
            c,
            args.runs,
            args.max_tokens,
            server_pid,
            args.api,
            args.client == "raw",
        )
        rows.append({"model": model, **row})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="an already running server (…/v1); default: start `rillet serve`")
    ap.add_argument("--model", help="model name (default: the one the started server serves)")
    ap.add_argument("--api-key", default="unused")
    ap.add_argument(
        "--set", dest="sets", action="append", default=[], help="config override for the started server"
    )
    ap.add_argument(
        "--api",
        choices=["chat", "responses", "messages"],
        default="chat",
        help="chat: /v1/chat/completions; responses: /v1/responses; messages: /v1/messages (anthropic)",
    )
    ap.add_argument(
        "--client",
        choices=["sdk", "raw"],
        default="sdk",
        help="sdk: the official openai / anthropic client; raw: http.client, the answer parsed once "
        "at its end (bench/lib/raw_client.py): the client's own CPU taken out of the comparison",
    )
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--runs", type=int, default=3, help="batches per mode and concurrency")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--out", help="JSON path (default: bench/out/stream_vs_nonstream[_API].json)")
    add_pinning(ap)
    ap.add_argument(
        "--server-python", help="the interpreter of the server to start (another checkout's venv)"
    )
    ap.add_argument(
        "--client-idle",
        action="store_true",
        help="run this client under SCHED_IDLE (Linux; after starting the server): it then only gets "
        "CPU the server leaves idle, as a client on another machine would take none",
    )
    args = ap.parse_args()
    cpus = pin_client(args)
    if args.out is None:
        suffix = "" if args.api == "chat" else f"_{args.api}"
        args.out = f"bench/out/stream_vs_nonstream{suffix}.json"

    with contextlib.ExitStack() as stack:
        server = None
        base_url = args.base_url
        if base_url is None:
            print("starting rillet serve ...", file=sys.stderr)
            server = stack.enter_context(RilletServer(args.sets, cpus=cpus, python=args.server_python))
            base_url = server.base_url
        pid = server.proc.pid if server and server.proc else None
        rows = run_levels(base_url, args, pid)
        rss = server.peak_rss_mib() if server else None
    result = {
        "base_url": base_url,
        "model": rows[0]["model"],
        "server_sets": args.sets,
        "client_idle": args.client_idle,
        "server_cpus": args.server_cpus,
        "client_cpus": args.client_cpus,
        "server_python": args.server_python,
        "api": args.api,
        "client": args.client,
        "server_peak_rss_mib": rss,
    }
    write_json(args.out, {**result, "rows": rows})
    model = result["model"]
    print(
        f"API {args.api}, {args.client} client; model {model}; {args.max_tokens} tokens per request, "
        f"greedy, ignore_eos; JSON: {args.out}"
    )
    if rss is not None:
        print(f"server peak RSS: {rss:.0f} MiB")
    cols = ["concurrency", "non-stream tok/s", "stream tok/s", "ratio", "pair ratios median [min, max]"]
    cols += ["pairs' mean [95 % interval]"]
    cols += ["stream TTFT ms", "client CPU ms/tok N|S", "server CPU ms/tok N|S", "of which loop N|S"]
    cols += ["loop S-N us/tok", "of which user", "engine wait ms/step N|S"]
    cols += ["engine CPU ms/step N|S", "engine runq ms/step N|S"]
    print(table(summary_rows(rows), cols))


if __name__ == "__main__":
    main()
