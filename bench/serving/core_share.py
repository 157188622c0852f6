"""Who uses the server's core while it streams: `perf` samples of that core, per thread, streamed vs not.

issue 25's pinned method puts the server on one core (one torch thread) and the client on another,
so every microsecond the event loop spends is one the model does not get. This script serves that
way, keeps C raw clients (bench/lib/raw_client.py) asking for 200 greedy tokens each, and for each
mode records the server's core with `perf record -C` for `--seconds`: per thread (the event loop is
the process's main thread; the engine and the server's other threads are the rest; idle and other
processes count only in the whole), the share of the core's samples and its kernel part, and from
/metrics the tokens made meanwhile. Reported:
  - loop us/token (user, kernel) streamed and not, and the difference: the server's extra CPU per
    streamed token, which on loopback includes the receiving side's TCP path and the client's
    wake-up (the kernel runs them in the sender's `send`);
  - engine share of the core: streamed / not is the ratio the model's speed can reach at best
    when the engine's own work per token is the same.

    .venv/bin/python -m bench.serving.core_share --concurrency 1 8 [--set k=v] [--seconds 10]

Needs `perf` and the rights to record a CPU (root, or kernel.perf_event_paranoid <= 0).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from bench.lib.common import table, write_json
from bench.lib.raw_client import RawClient
from bench.lib.server_proc import RilletServer
from bench.serving.serve_sweep import served_model

PROMPT = "What is the meaning of life?"
ROW = re.compile(r"^\s*(\d+)\s+(\d+):\S*\s+(\S+)")  # samples, tid:comm, dso


def tokens(srv: RilletServer) -> float:
    return srv.metric("rillet_generation_tokens_total") or 0.0


def per_thread(data: Path) -> dict[int, list[int]]:
    """tid -> [samples, of which in the kernel] from a `perf record` file."""
    report = ["perf", "report", "-i", str(data), "--stdio", "--no-children"]
    out = subprocess.run(
        [*report, "--sort", "pid,dso", "-F", "sample,pid,dso"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts: dict[int, list[int]] = {}
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            c = counts.setdefault(int(m[2]), [0, 0])
            c[0] += int(m[1])
            c[1] += int(m[1]) if m[3] == "[kernel.kallsyms]" else 0
    return counts


def window(srv: RilletServer, model: str, c: int, stream: bool, seconds: float, core: int) -> dict[str, Any]:
    stop = threading.Event()

    def client() -> None:
        raw = RawClient(srv.base_url, "chat")
        while not stop.is_set():
            raw.request(model, PROMPT, stream, 200)

    threads = [threading.Thread(target=client) for _ in range(c)]
    for t in threads:
        t.start()
    time.sleep(2)  # every client in its first request
    data = Path(f"bench/out/core_share_c{c}_{'S' if stream else 'N'}.data")
    t0 = tokens(srv)
    subprocess.run(
        ["perf", "record", "-C", str(core), "-o", str(data), "--", "sleep", str(seconds)],
        capture_output=True,
        check=True,
    )
    made = tokens(srv) - t0
    stop.set()
    for t in threads:
        t.join()
    counts = per_thread(data)
    assert srv.proc is not None
    pid = srv.proc.pid
    server = {int(t) for t in os.listdir(f"/proc/{pid}/task")}  # its threads (the loop: pid)
    total = sum(v[0] for v in counts.values())  # the whole core, idle and other processes too
    loop = counts.get(pid, [0, 0])
    engine = sum(v[0] for tid, v in counts.items() if tid in server and tid != pid)
    us = seconds * 1e6 / total  # one sample's share of the window
    return {
        "concurrency": c,
        "stream": stream,
        "tokens": made,
        "samples": total,
        "loop_us_per_token": loop[0] * us / made,
        "loop_kernel_us_per_token": loop[1] * us / made,
        "engine_share": engine / total,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--server-cpu", type=int, default=0)
    ap.add_argument("--client-cpu", type=int, default=1)
    ap.add_argument("--set", dest="sets", action="append", default=["model.num_threads=1"])
    ap.add_argument("--out", default="bench/out/core_share.json")
    args = ap.parse_args()
    os.sched_setaffinity(0, {args.client_cpu})
    rows: list[dict[str, Any]] = []
    with RilletServer(args.sets, cpus={args.server_cpu}) as srv:
        model = served_model(srv.base_url, "auto")
        for c in args.concurrency:
            n, s = (window(srv, model, c, stream, args.seconds, args.server_cpu) for stream in (False, True))
            rows.append(
                {
                    "concurrency": c,
                    "loop_us_per_token_N": n["loop_us_per_token"],
                    "loop_us_per_token_S": s["loop_us_per_token"],
                    "loop_S_minus_N_us": s["loop_us_per_token"] - n["loop_us_per_token"],
                    "of_which_kernel_us": s["loop_kernel_us_per_token"] - n["loop_kernel_us_per_token"],
                    "engine_share_N": n["engine_share"],
                    "engine_share_S": s["engine_share"],
                    "engine_share_ratio": s["engine_share"] / n["engine_share"],
                    "windows": [n, s],
                }
            )
        rss = srv.peak_rss_mib()
    cols = ["concurrency", "loop_us_per_token_N", "loop_us_per_token_S", "loop_S_minus_N_us"]
    cols += ["of_which_kernel_us", "engine_share_N", "engine_share_S", "engine_share_ratio"]
    write_json(args.out, {"server_sets": args.sets, "server_peak_rss_mib": rss, "rows": rows})
    print(f"server core {args.server_cpu}, client core {args.client_cpu}; server peak RSS {rss:.0f} MiB")
    print(table(rows, cols))


if __name__ == "__main__":
    main()
