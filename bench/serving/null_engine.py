"""The serving stack alone: the synthetic model (no compute, fixed step time) behind the real
scheduler, ring, dispatcher, SSE and JSON, at 1, 64 and 256 concurrent streams.

Per level, streaming and not: delivered tok/s (tokens the clients received, from usage, over the
client wall time) against the engine's rate (tokens it generated per second of engine busy time,
i.e. steps/s x active streams).
If the front end falls behind, the engine's ring fills or delivery lags the engine, and the ratio
drops below 1.

    .venv/bin/python -m bench.serving.null_engine [--step-ms 5] [--streams 1 64 256] [--tokens 400]
        [--repeats 3] [--async --overlap off on] [--prompt-words 0] [--server-cpus 0 --client-cpus 1]

`--server-cpus 0 --client-cpus 1` pins the server and this client to separate cores (the seed's
method for the real model): co-located on two cores, the streaming client's own SSE parsing takes
CPU the server's threads would have had, and that share of the gap is the client's, not the server's.
`--async` runs the asynchronous null engine (a launch returns at once, tokens ready step-ms later
on a simulated device timeline, like a GPU); `--overlap off on` runs one server per engine.overlap
setting, side by side. `--prompt-words N` makes every prompt N words longer (about N tokens: long
contexts, long block tables). "host ms" is the engine thread's own time per step: busy time minus
the time it waited for the device (rillet_engine_device_wait_seconds); "mid" columns are the same
over the middle half of each run (counters polled every 0.2 s): steady decode, without the
prefill steps and the last stragglers.

Each level runs `--repeats` times, streaming and not alternating (S N N S S N ...), over keep-alive
connections opened before the clock starts; rates are totals over the repeats, and the spread of
the per-run stream/non-stream ratios is reported beside them. The KV pool is sized so that every
stream fits at once (the synthetic default of 4,096 blocks holds only ~150 streams of 400 tokens:
the rest would wait or be preempted, and the level would not measure 256 streams).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from typing import Any

from bench.lib.common import add_pinning, peak_rss_mib, pin_client, process_cpu, table, write_json
from bench.lib.loadgen import run_level
from bench.lib.ratio_ci import ratio_ci
from bench.lib.server_proc import RilletServer


def counters(srv: RilletServer) -> tuple[float, float, float, float]:
    steps = srv.metric("rillet_engine_steps_total") or srv.metric("rillet_engine_steps") or 0.0
    busy = srv.metric("rillet_engine_busy_seconds_total") or srv.metric("rillet_engine_busy_seconds") or 0.0
    tokens = srv.metric("rillet_generation_tokens_total") or 0.0
    wait = srv.metric("rillet_engine_device_wait_seconds_total") or 0.0
    return steps, busy, tokens, wait


def null_engine_overrides(
    streams: int, tokens: int, step_ms: float = 5.0, prompt_tokens: int = 64
) -> list[str]:
    """Config for the synthetic model serving `streams` requests of `tokens` tokens at once."""
    per_stream = -(-(tokens + prompt_tokens) // 16)  # every stream fits (16-token blocks)
    return [
        "model.kind=synthetic",
        f"model.synthetic_step_ms={step_ms}",
        f"scheduler.max_num_seqs={streams}",
        f"scheduler.max_num_batched_tokens={max(2048, streams * 64)}",
        f"scheduler.max_waiting={max(1024, 2 * streams)}",
        f"cache.num_blocks={streams * per_stream + 64}",
        "logging.level=WARNING",
    ]


def long_prompt(words: int) -> str:
    base = "Write a long story about a lighthouse keeper."
    return base if words <= 0 else " ".join(["lighthouse"] * words) + " " + base


class Poller:
    """Samples the counters every `every` s from `start()` on: the middle of a run is its steady
    decode, without the prefill steps at the start or the stragglers at the end."""

    def __init__(self, srv: RilletServer, every: float = 0.2) -> None:
        self.srv, self.every = srv, every
        self.samples: list[tuple[float, float, float, float, float]] = []  # (t, steps, busy, tok, wait)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append((time.perf_counter(), *counters(self.srv)))

    def middle(self) -> tuple[float, float, float]:
        """(steps, busy s, wait s) between 25 % and 75 % of the sampled span."""
        if len(self.samples) < 4:
            return 0.0, 0.0, 0.0
        t0, t1 = self.samples[0][0], self.samples[-1][0]
        mid = [x for x in self.samples if t0 + 0.25 * (t1 - t0) <= x[0] <= t0 + 0.75 * (t1 - t0)]
        if len(mid) < 2:
            return 0.0, 0.0, 0.0
        a, b = mid[0], mid[-1]
        return b[1] - a[1], b[2] - a[2], b[4] - a[4]


def level(srv: RilletServer, streams: int, tokens: int, stream: bool, prompt: str) -> dict[str, Any]:
    start: list[tuple[float, float, float, float]] = []
    poller = Poller(srv)
    pid = srv.proc.pid if srv.proc is not None else None
    loop0: list[float | None] = []

    def on_start() -> None:  # after the warm-up requests
        start.append(counters(srv))
        loop0.append(process_cpu(pid, pid))
        poller.start()

    try:
        res = asyncio.run(
            run_level(
                srv.base_url,
                "synthetic",
                streams,
                streams,
                tokens,
                stream,
                prompt=prompt,
                warm=True,
                on_start=on_start,
            )
        )
    finally:
        poller.stop()
    (s0, b0, k0, w0), (s1, b1, k1, w1) = start[0], counters(srv)
    loop1 = process_cpu(pid, pid)
    mid_steps, mid_busy, mid_wait = poller.middle()
    return {
        "loop_cpu_s": loop1 - loop0[0] if loop1 is not None and loop0[0] is not None else None,
        "tokens": res.tokens,
        "wall_s": res.wall_s,
        "engine_tokens": k1 - k0,
        "busy_s": b1 - b0,
        "wait_s": w1 - w0,
        "steps": s1 - s0,
        "mid_steps": mid_steps,
        "mid_busy_s": mid_busy,
        "mid_wait_s": mid_wait,
        "errors": res.errors,
        # from the first request to finish to the last: when every request ends at the same step
        # (same max_tokens), the time the front end takes to deliver the rest after the engine
        "tail_s": res.wall_s - min(res.latencies) if res.latencies else None,
        # streamed: the median request's time to its first token (the burst's prefill included)
        "ttft_p50_s": statistics.median(res.ttft) if stream and res.ttft else None,
    }


def _steady(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Step and host time over the middle half of each run (steady decode)."""
    steps = sum(r["mid_steps"] for r in runs)
    busy = sum(r["mid_busy_s"] for r in runs)
    wait = sum(r["mid_wait_s"] for r in runs)
    if not steps:
        return {"mid_step_ms": None, "mid_host_ms": None}
    return {"mid_step_ms": busy / steps * 1000, "mid_host_ms": (busy - wait) / steps * 1000}


def _mean_ms(xs: list[float | None]) -> float | None:
    got = [x for x in xs if x is not None]
    return statistics.mean(got) * 1000 if got else None


def aggregate(runs: list[dict[str, Any]], streams: int, stream: bool) -> dict[str, Any]:
    tokens = sum(r["tokens"] for r in runs)
    wall = sum(r["wall_s"] for r in runs)
    busy = sum(r["busy_s"] for r in runs)
    wait = sum(r["wait_s"] for r in runs)
    steps = sum(r["steps"] for r in runs)
    # The engine's rate: tokens it produced per second of its own busy time (steps/s x the streams
    # actually active in those steps, ramp-up included).
    engine_rate = sum(r["engine_tokens"] for r in runs) / busy if busy > 0 else 0.0
    delivered = tokens / wall if wall > 0 else 0.0
    loop = [r["loop_cpu_s"] for r in runs]
    return {
        "streams": streams,
        "stream": stream,
        # the event loop thread's CPU per delivered token (HTTP, routing, SSE or JSON)
        "loop_us_per_tok": 1e6 * sum(loop) / tokens if tokens and None not in loop else None,
        "delivered_tok_s": delivered,
        "engine_tok_s": engine_rate,
        "ratio": delivered / engine_rate if engine_rate else None,
        "step_ms": busy / steps * 1000 if steps else None,
        "tail_ms": statistics.mean(r["tail_s"] for r in runs if r["tail_s"] is not None) * 1000
        if any(r["tail_s"] is not None for r in runs)
        else None,
        "host_ms": (busy - wait) / steps * 1000 if steps else None,
        "ttft_ms": _mean_ms([r.get("ttft_p50_s") for r in runs]),
        **_steady(runs),
        "errors": sum(r["errors"] for r in runs),
        "runs": runs,
    }


def measure(
    a: argparse.Namespace, overlap: str | None, cpus: set[int] | None
) -> tuple[list[dict[str, Any]], float | None]:
    top = max(a.streams)
    prompt = long_prompt(a.prompt_words)
    overrides = [*null_engine_overrides(top, a.tokens, a.step_ms, a.prompt_words + 64), *a.set]
    if a.async_engine:
        overrides.append("model.synthetic_async=true")
    if overlap is not None:
        overrides.append(f"engine.overlap={overlap}")
    rows = []
    with RilletServer(overrides, cpus=cpus) as srv:
        asyncio.run(run_level(srv.base_url, "synthetic", 4, 8, 16, True))  # warm-up
        for n in a.streams:
            runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
            for i in range(2 * a.repeats):
                stream = (i % 4) in (0, 3)  # S N N S S N ...: neither mode always goes first
                runs[stream].append(level(srv, n, a.tokens, stream, prompt))
            s_row, ns_row = aggregate(runs[True], n, True), aggregate(runs[False], n, False)
            pairs = [
                x["tokens"] / x["wall_s"] / (y["tokens"] / y["wall_s"])
                for x, y in zip(runs[True], runs[False], strict=True)
            ]
            s_row["stream_vs_nonstream"] = s_row["delivered_tok_s"] / ns_row["delivered_tok_s"]
            s_row["svn_min"], s_row["svn_max"] = min(pairs), max(pairs)
            s_row["svn_ci95"] = ratio_ci(pairs).text()  # the runs' geometric mean [95 % interval]
            for row in (s_row, ns_row):
                row["overlap"] = overlap or "auto"
            rows += [s_row, ns_row]
            print(
                f"  overlap={overlap or 'auto'} streams={n}: step {s_row['step_ms']:.2f} / "
                f"{ns_row['step_ms']:.2f} ms, stream/non-stream {s_row['stream_vs_nonstream']:.3f} "
                f"(runs {s_row['svn_ci95']})",
                flush=True,
            )
        return rows, srv.peak_rss_mib()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--async", dest="async_engine", action="store_true", help="asynchronous null engine")
    ap.add_argument("--overlap", nargs="+", choices=["auto", "on", "off"], default=None)
    ap.add_argument("--prompt-words", type=int, default=0, help="longer prompts (about 1 token per word)")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides")
    add_pinning(ap)
    ap.add_argument("--out", default="bench/out/null_engine.json")
    a = ap.parse_args()
    cpus = pin_client(a)
    rows: list[dict[str, Any]] = []
    rss: dict[str, float | None] = {}
    for overlap in a.overlap or [None]:
        got, rss[overlap or "auto"] = measure(a, overlap, cpus)
        rows += got
    write_json(
        a.out,
        {
            "step_ms": a.step_ms,
            "tokens": a.tokens,
            "repeats": a.repeats,
            "async": a.async_engine,
            "prompt_words": a.prompt_words,
            "server_cpus": a.server_cpus,
            "client_cpus": a.client_cpus,
            "rows": rows,
            "server_peak_rss_mib": rss,
            "client_peak_rss_mib": peak_rss_mib(),
        },
    )
    print(
        f"server peak RSS {rss} MiB; step {a.step_ms} ms; {a.tokens} tokens per request; "
        f"{a.repeats} runs per mode; {'asynchronous' if a.async_engine else 'synchronous'} null engine; "
        f"prompts +{a.prompt_words} words; server cores {a.server_cpus or 'any'}, client cores "
        f"{a.client_cpus or 'any'}"
    )
    cols = [
        "overlap",
        "streams",
        "stream",
        "delivered_tok_s",
        "engine_tok_s",
        "ratio",
        "step_ms",
        "host_ms",
        "mid_step_ms",
        "mid_host_ms",
        "tail_ms",
        "ttft_ms",
        "loop_us_per_tok",
        "stream_vs_nonstream",
        "svn_min",
        "svn_max",
        "svn_ci95",
        "errors",
    ]
    print(table(rows, cols))


if __name__ == "__main__":
    main()
