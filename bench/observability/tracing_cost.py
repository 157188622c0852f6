"""What OpenTelemetry tracing (observability.otlp_endpoint) costs the serving stack: two `rillet serve`
processes of the synthetic model (no compute: the front end's work is all there is to slow down),
one exporting a span per request to a stand-in collector (bench/lib/otlp_sink.py), one not, at the
same concurrency, their runs interleaved (on off off on ...) so the machine's drift cancels within
a pair. Every request carries a caller's traceparent, so the traced server continues it.

    .venv/bin/python -m bench.observability.tracing_cost [--streams 64] [--tokens 64] [--per-stream 8]
        [--repeats 5] [--step-ms 5]

Short answers (64 tokens) make the per-request work (one span each) weigh the most against the
per-token work. Per mode (streamed, not): delivered tok/s and requests/s of each server, the
event loop's and the whole process's CPU per request, and traced / untraced throughput as the
paired runs' geometric mean with its 95 % interval. The sink's span count is checked against the
requests made (a span lost or never sent would make tracing look cheaper than it is).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from bench.lib.common import peak_rss_mib, process_cpu, table, write_json
from bench.lib.loadgen import run_level
from bench.lib.ratio_ci import ratio_ci
from bench.lib.server_proc import RilletServer, free_port
from bench.serving.null_engine import null_engine_overrides

CALLER = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}


def run(srv: RilletServer, streams: int, requests: int, tokens: int, stream: bool) -> dict[str, Any]:
    pid = srv.proc.pid if srv.proc is not None else None
    cpu0: list[tuple[float | None, float | None]] = []

    def on_start() -> None:
        cpu0.append((process_cpu(pid, pid), threads_cpu(pid)))

    level = run_level(
        srv.base_url,
        "synthetic",
        streams,
        requests,
        tokens,
        stream,
        headers=CALLER,
        warm=True,
        on_start=on_start,
    )
    res = asyncio.run(level)
    (loop0, proc0), loop1, proc1 = cpu0[0], process_cpu(pid, pid), threads_cpu(pid)
    return {
        "tok_s": res.tokens / res.wall_s,
        "req_s": res.requests / res.wall_s,
        "requests": res.requests + streams,  # the warm-up's are traced too
        "errors": res.errors,
        "loop_us_per_req": _per_request(loop0, loop1, res.requests),
        "cpu_us_per_req": _per_request(proc0, proc1, res.requests),
    }


def threads_cpu(pid: int | None) -> float | None:
    """CPU seconds of every live thread of a process (the span exporter's included), from each
    thread's nanosecond schedstat: /proc/PID/stat's 10 ms ticks are too coarse per request."""
    if pid is None:
        return None
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[0]) / 1e9
    return total


def _per_request(before: float | None, after: float | None, requests: int) -> float | None:
    return None if before is None or after is None else 1e6 * (after - before) / requests


def row(runs: list[dict[str, Any]], tracing: str, stream: bool) -> dict[str, Any]:
    def mean(key: str) -> float | None:
        got = [r[key] for r in runs if r[key] is not None]
        return statistics.mean(got) if got else None

    return {
        "stream": stream,
        "tracing": tracing,
        "tok_s": mean("tok_s"),
        "req_s": mean("req_s"),
        "loop_us_per_req": mean("loop_us_per_req"),
        "cpu_us_per_req": mean("cpu_us_per_req"),
        "errors": sum(r["errors"] for r in runs),
    }


def compare(
    servers: dict[str, RilletServer], a: argparse.Namespace, stream: bool
) -> tuple[list[dict[str, Any]], int]:
    """One mode, the two servers' runs interleaved: their rows, and the requests the traced one served."""
    runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    for i in range(2 * a.repeats):
        name = "on" if (i % 4) in (0, 3) else "off"  # on off off on on off ...
        runs[name].append(run(servers[name], a.streams, a.streams * a.per_stream, a.tokens, stream))
    on_row, off_row = row(runs["on"], "on", stream), row(runs["off"], "off", stream)
    ci = ratio_ci([x["tok_s"] / y["tok_s"] for x, y in zip(runs["on"], runs["off"], strict=True)])
    on_row["on_vs_off"], on_row["ci95"] = ci.mean, ci.text()
    print(f"  {'streamed' if stream else 'not streamed'}: on/off {ci.text()}", flush=True)
    return [on_row, off_row], sum(r["requests"] for r in runs["on"])


def sink_spans(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=60) as r:
        return int(json.loads(r.read())["spans"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--per-stream", type=int, default=8, help="requests each client stream makes per run")
    ap.add_argument("--repeats", type=int, default=5, help="runs per server and mode")
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--out", default="bench/out/tracing_cost.json")
    a = ap.parse_args()
    requests = a.streams * a.per_stream
    base = null_engine_overrides(a.streams, a.tokens, a.step_ms)
    sink_port = free_port()
    sink = subprocess.Popen([sys.executable, "-m", "bench.lib.otlp_sink", str(sink_port)])
    traced_cfg = [*base, f"observability.otlp_endpoint=http://127.0.0.1:{sink_port}/v1/traces"]
    rows: list[dict[str, Any]] = []
    traced_requests = 0
    try:
        with RilletServer(traced_cfg) as on, RilletServer(base) as off:
            servers = {"on": on, "off": off}
            for srv in servers.values():  # warm-up
                asyncio.run(run_level(srv.base_url, "synthetic", 8, 16, 16, True, headers=CALLER))
            traced_requests += 16
            for stream in (True, False):
                got, traced = compare(servers, a, stream)
                rows += got
                traced_requests += traced
            rss = {k: s.peak_rss_mib() for k, s in servers.items()}
        # the traced server has exited: its shutdown exported every span still queued
        spans = sink_spans(sink_port)
    finally:
        sink.terminate()
        sink.wait(10)
    cols = ["stream", "tracing", "tok_s", "req_s", "loop_us_per_req", "cpu_us_per_req", "on_vs_off", "ci95"]
    cols.append("errors")
    print(
        f"c = {a.streams}, {a.tokens} tokens per request, {requests} requests per run, {a.repeats} runs per "
        f"server and mode, synthetic step {a.step_ms} ms; spans received {spans} of {traced_requests} "
        f"traced requests; server peak RSS {rss} MiB"
    )
    print(table(rows, cols))
    write_json(
        a.out,
        {
            "streams": a.streams,
            "tokens": a.tokens,
            "requests_per_run": requests,
            "repeats": a.repeats,
            "step_ms": a.step_ms,
            "spans_received": spans,
            "traced_requests": traced_requests,
            "rows": rows,
            "server_peak_rss_mib": rss,
            "client_peak_rss_mib": peak_rss_mib(),
        },
    )


if __name__ == "__main__":
    main()
