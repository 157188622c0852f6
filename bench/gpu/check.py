"""The ONE GPU check of issue 5 (one device call of <= 420 s on the H200, the kit's install included).
Prints a table last; writes all numbers as JSON after every part ($OUT/gpu_check.json when OUT is
set, else bench/out/gpu_check.json).

    bash bench/gpu/run.sh stage                        # here: GPU kit, wheels, tokenizer into .gpu/
    bash bench/gpu/run.sh                              # there (bench/gpu/GPU.md has the exact call)
    .venv/bin/python -m bench.gpu.check --cpu-smoke    # the same code on CPU, tiny shapes (tests)

Parts, in order (bench/gpu/plan.py PARTS); one that raises is marked FAIL and the rest still run; one that
the time budget cannot fit is not started (SKIP); a watchdog prints the table and exits if a part
overruns. The parts that answer the targets come first, on one 7B engine:
  copy bandwidth | build the 7B engine with CUDA graphs | (b) batch-1 decode vs the roofline |
  (c) batch-64 decode at ~1k context | (d) stream vs non-stream through the HTTP server, c=1, 8, 64 |
  (a) greedy tokens graphs vs eager, 7B | then (a) logits vs transformers, 7B shape and default
  shape | (a) greedy tokens graphs vs eager, default shape (a second compile, so last).
The budget counts from GPU_RUN_START (epoch seconds, exported by run.sh before the install)
when set, else from this script's start.
This file holds the order of the parts, part (d)'s HTTP client and the command line; the run's
record, a part's run and the watchdog are in bench/gpu/results.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.gpu.greedy import rejudge
from bench.gpu.plan import NEED_S, make_plan, row
from bench.gpu.results import Results, run_part, setup_seconds, start_watchdog
from bench.lib.common import OUT

MODULE = "bench.gpu.check"  # run again as part (d)'s client
# --only takes these
PART_KEYS = ("bw", "build", "b", "c", "d", "greedy7b", "spec", "logits", "greedy", "specengine")


def run_all(
    res: Results, only: set[str], d_apis: Sequence[str] | None = None, d_gates: Sequence[str] = ()
) -> None:
    """PARTS (bench/gpu/plan.py) in order: bw, build 7B, (b), (c), (d), greedy 7B, (e) verify cost;
    then speculative decoding's engines ((g) 7B speed, (f) tokens), the logits comparisons and the
    default shape's greedy check, each skipped when the budget has no room left for it."""
    import bench.gpu.parts as g
    import bench.gpu.speculative as s
    from bench.gpu.plan import free_memory

    p = res.plan

    def part(key: str, name: str, fn: Any) -> Any:
        if only and key not in only:
            return None
        return run_part(res, name, NEED_S[name] * p.scale, fn)

    bw = part("bw", "copy bandwidth", lambda: g.part_env_and_bandwidth(p))
    tb_s = bw if isinstance(bw, float) else None
    uses_big = not only or bool(only & {"build", "greedy7b", "b", "c", "d", "spec"})
    built = (
        run_part(
            res,
            "build 7B engine",
            NEED_S["build 7B engine"] * p.scale,
            lambda: g.part_build(p, res.time_left),
        )
        if uses_big
        else None
    )
    mode = "default"
    if built is not None:
        big, mode = built
        try:
            part("b", "(b) batch-1 decode", lambda: g.part_b(p, big, tb_s))
            part("c", "(c) batch-64 decode", lambda: g.part_c(p, big, tb_s))
            part("d", "(d) stream vs non-stream", lambda: g.part_d(p, big, MODULE, d_apis))
            for gate in d_gates if not only or "d" in only else ():  # only on request, not in PARTS
                name = f"(d) engine gate {gate}"
                run_part(res, name, 40 * p.scale, lambda gate=gate: g.part_d(p, big, MODULE, gate=gate))
            part("greedy7b", "(a) greedy 7B", lambda: g.part_greedy(p, "7B", big, mode))
            plain = part("spec", "(e) verify step", lambda: s.part_spec(p, big))
        finally:
            big.close()
            del big, built
            free_memory(p)
        part("spec", "(g) spec speed 7B", lambda: s.part_spec_speed(p, plain))
    part("specengine", "(f) spec engine", lambda: s.part_spec_engine(p))
    part("logits", "(a) logits 7B", lambda: g.part_logits(p, "7B", p.big_arch))
    part("logits", "(a) logits default", lambda: g.part_logits(p, "default", p.small_arch))
    part("greedy", "(a) greedy default", lambda: g.part_greedy(p, "default", None, mode))
    for role in ("7B", "default"):  # ties judged against the bf16 noise the logits parts measured
        rejudge(res.parts, res.rows, role, judged=p.device == "cuda")
    res.write()


# ---- the HTTP client of part (d), run as a subprocess so it never shares the server's GIL ---------


def stream_ratios(
    url: str, model: str, concurrency: list[int], runs: int, max_tokens: int
) -> list[dict[str, Any]]:
    """Per concurrency C: batches of C chat requests (bench/lib/loadgen.py, aiohttp), non-stream and
    stream in ABBA order; tok/s per mode from `usage`; ratio = stream / non-stream (the seed issue's
    measurement)."""
    from bench.lib.loadgen import run_level

    def batch(c: int) -> Batch:
        def send(stream: bool, n: int) -> tuple[float, float, float]:
            r = asyncio.run(run_level(url, model, c, c, n, stream))
            return r.tokens, r.wall_s, r.errors

        return send

    return [abba_level(url, c, runs, max_tokens, batch(c)) for c in concurrency]


def api_ratios(
    url: str, model: str, api: str, concurrency: list[int], runs: int, max_tokens: int
) -> list[dict[str, Any]]:
    """As stream_ratios, on /v1/responses or /v1/messages (issue 34): C threads, each with its own
    kept-alive bench/lib/raw_client.py connection, send one request per batch; tok/s from `usage`."""
    from concurrent.futures import ThreadPoolExecutor

    from bench.lib.raw_client import RawClient

    out = []
    for c in concurrency:
        clients = [RawClient(url, api) for _ in range(c)]
        with ThreadPoolExecutor(c) as pool:

            def send(stream: bool, n: int, clients: list[RawClient] = clients) -> tuple[float, float, float]:
                return _api_batch(pool, clients, model, stream, n)

            out.append({"api": api, **abba_level(url, c, runs, max_tokens, send)})
    return out


Batch = Callable[[bool, int], tuple[float, float, float]]  # (stream, max tokens) -> tokens, wall s, errors
# per mode: tokens, seconds, errors, the client's CPU s, then the COUNTERS' deltas
Tally = dict[bool, list[float]]
COUNTERS = (
    "rillet_engine_steps",
    "rillet_engine_busy_seconds",
    "rillet_engine_device_wait_seconds",
    "rillet_dispatch_cpu_seconds",  # the event loop's thread inside the ring's callback
    "rillet_device_busy_seconds",  # the device's span of each step (CUDA timing events)
    "rillet_device_idle_seconds",  # ... and its idle time between steps while one was due
    "rillet_device_prep_seconds",  # of busy: before each step's forward
    "rillet_device_late_launches",  # launches done after the device had finished the step before
)
T_TOK, T_S, T_ERR, T_CLIENT, T_STEPS, T_BUSY, T_WAIT, T_LOOP, T_DEV_BUSY, T_DEV_IDLE, T_PREP, T_LATE = range(
    12
)


def abba_level(url: str, c: int, runs: int, max_tokens: int, batch: Batch) -> dict[str, Any]:
    """A warm-up batch per mode (first-request costs stay out), then `runs` batches per mode in
    ABBA order, each with the engine's counters read around it."""
    for stream in (False, True):
        batch(stream, 8)
    tot: Tally = {False: [0.0] * 12, True: [0.0] * 12}
    for i in range(runs):
        for stream in (False, True) if i % 2 == 0 else (True, False):
            before = engine_counters(url)
            cpu0 = time.process_time()  # the client's own CPU (all its threads)
            got = batch(stream, max_tokens)
            cpu = time.process_time() - cpu0
            after = engine_counters(url)
            for j, v in enumerate((*got, cpu, *(x - y for x, y in zip(after, before, strict=True)))):
                tot[stream][j] += v
    return _level(c, runs, max_tokens, tot)


def engine_counters(url: str) -> tuple[float, ...]:
    """The engine's steps, busy and device-wait seconds from the server's /metrics: their deltas
    over a batch give the engine thread's host time a step (busy - wait), the part of a step the
    event loop's work can hold up through the GIL."""
    from bench.lib.server_proc import scrape_metrics

    got = scrape_metrics(url.rsplit("/v1", 1)[0], timeout=10)
    return tuple(got.get(f"{n}_total", got.get(n, 0.0)) for n in COUNTERS)


def _api_batch(pool: Any, clients: list[Any], model: str, stream: bool, n: int) -> tuple[float, float, float]:
    """One request per client at once: (tokens, wall seconds, errors)."""
    t0 = time.perf_counter()
    futs = [
        pool.submit(cl.request, model, f"Write a long story (#{i}).", stream, n)
        for i, cl in enumerate(clients)
    ]
    got = [f.result()[0] if f.exception() is None else None for f in futs]
    wall = time.perf_counter() - t0
    return sum(g for g in got if g is not None), wall, sum(g is None for g in got)


def _level(c: int, runs: int, max_tokens: int, tot: Tally) -> dict[str, Any]:
    ns, s = tot[False][T_TOK] / tot[False][T_S], tot[True][T_TOK] / tot[True][T_S]

    def host_ms(t: list[float]) -> float | None:  # the engine thread's own time a step
        return (t[T_BUSY] - t[T_WAIT]) / t[T_STEPS] * 1e3 if t[T_STEPS] else None

    def per_step_ms(t: list[float], j: int) -> float | None:
        return t[j] / t[T_STEPS] * 1e3 if t[T_STEPS] else None

    def per_token_us(t: list[float], j: int) -> float | None:
        return t[j] / t[T_TOK] * 1e6 if t[T_TOK] else None

    def modes(f: Callable[[list[float]], float | None]) -> dict[str, float | None]:
        return {"nonstream": f(tot[False]), "stream": f(tot[True])}

    return {
        "concurrency": c,
        "runs": runs,
        "max_tokens": max_tokens,
        "nonstream_tok_s": ns,
        "stream_tok_s": s,
        "ratio": s / ns if ns else None,
        "tokens": {
            "nonstream": int(tot[False][0]),
            "stream": int(tot[True][0]),
            "expected_each": runs * c * max_tokens,
        },
        "errors": int(tot[False][T_ERR] + tot[True][T_ERR]),
        "steps": {"nonstream": int(tot[False][T_STEPS]), "stream": int(tot[True][T_STEPS])},
        "host_ms_per_step": modes(host_ms),
        # the batch's wall time a step, and the part of it the engine waited for the device
        "wall_ms_per_step": modes(lambda t: per_step_ms(t, T_S)),
        "device_wait_ms_per_step": modes(lambda t: per_step_ms(t, T_WAIT)),
        "device_busy_ms_per_step": modes(lambda t: per_step_ms(t, T_DEV_BUSY)),
        "device_idle_ms_per_step": modes(lambda t: per_step_ms(t, T_DEV_IDLE)),
        "device_prep_ms_per_step": modes(lambda t: per_step_ms(t, T_PREP)),
        "late_launch_share": modes(lambda t: t[T_LATE] / t[T_STEPS] if t[T_STEPS] else None),
        "loop_us_per_token": modes(lambda t: per_token_us(t, T_LOOP)),
        "client_us_per_token": modes(lambda t: per_token_us(t, T_CLIENT)),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_out = (
        Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else OUT / "gpu_check.json"
    )
    ap.add_argument("--out", type=Path, default=default_out, help="JSON results (default: %(default)s)")
    ap.add_argument(
        "--cpu-smoke", action="store_true", help="tiny shapes on CPU: checks the script, measures nothing"
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        help="time budget from GPU_RUN_START (default 380 on GPU: a 420 s device call; 120 smoke)",
    )
    ap.add_argument(
        "--stage-tokenizer",
        type=Path,
        metavar="PATH",
        help="write the default tokenizer (GGUF metadata only) and exit",
    )
    ap.add_argument("--only", nargs="+", choices=PART_KEYS, default=[], help="run only these parts (a rerun)")
    ap.add_argument(
        "--d-apis",
        nargs="*",
        choices=("responses", "messages"),
        help="(d)'s endpoints after chat (default both; none: chat only)",
    )
    ap.add_argument(
        "--d-gate",
        nargs="+",
        default=[],
        choices=("off", "last", "device", "clock", "none", "depth2", "depth2-none", "depth2-device"),
        help="after (d): chat at its two highest levels again per variant of the event loop's engine "
        "gate (stream.engine_first off, or on with that probe; last: off, with each routing pass's "
        "writes held to its end, the write order before de082c1; depth2: off, two steps in flight, "
        "engine.overlap_depth 2; depth2-<probe>: two steps in flight and the gate on)",
    )
    ap.add_argument("--client", metavar="BASE_URL", help=argparse.SUPPRESS)  # part (d)'s subprocess
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64], help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--max-tokens", type=int, default=128, help=argparse.SUPPRESS)
    ap.add_argument("--api", default="chat", help=argparse.SUPPRESS)  # chat | responses | messages
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.client:
        if args.api == "chat":
            rows = stream_ratios(args.client, args.model, args.concurrency, args.runs, args.max_tokens)
        else:
            rows = api_ratios(args.client, args.model, args.api, args.concurrency, args.runs, args.max_tokens)
        print(json.dumps(rows))
        return 0
    if args.stage_tokenizer:
        from bench.gpu.plan import write_tokenizer_gguf

        print(f"{args.stage_tokenizer}: {write_tokenizer_gguf(args.stage_tokenizer)} bytes")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # one line per request otherwise
    res = Results(args.out, make_plan(args.cpu_smoke, args.budget_s), setup_s=setup_seconds())
    watchdog = start_watchdog(res)
    try:
        run_all(res, set(args.only), args.d_apis, args.d_gate)
    except Exception as exc:  # outside any part (closing an engine): still print what was measured
        res.rows.append(row("gpu_check", verdict="FAIL", note=f"{type(exc).__name__}: {str(exc)[:150]}"))
    finally:
        watchdog.cancel()
    res.write()
    print(res.report(), flush=True)
    return 1 if any(r["verdict"] == "FAIL" for r in res.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
