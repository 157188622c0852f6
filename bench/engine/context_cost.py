"""What the compiled steps cost as the cached context grows, on the default model (offline, 1 row):

  decode   the compiled decode step's time per step after a prompt of C tokens (median of the
           steps of a 33-token greedy answer);
  prefill  a prefill of N new tokens after C cached ones (a prefix-cache hit's tail; C = 0: a
           fresh prompt), through the compiled multi-query step (graphs.short_prefill) and eager
           (the compiled steps switched off for that request): TTFT with max_tokens=1.

    .venv/bin/python -m bench.engine.context_cost
    .venv/bin/python -m bench.engine.context_cost --contexts 0 512 --new 8 64 --repeats 3

Prints the tables last and writes JSON (with the process's peak RSS).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams

from bench.lib.common import decode_path, peak_rss_mib, table, write_json


def ids(n: int, salt: int) -> list[int]:
    return [(53 * k + 7 * salt + n) % 40000 + 100 for k in range(n)]


def step_times(llm: LLM) -> list[float]:
    """Wraps the runner's launch: appends each decode-only step's launch-to-landing time."""
    runner = llm.engine.core.runner
    real = runner.launch
    times: list[float] = []

    def launch(batch: Any) -> Any:
        t0 = time.perf_counter()
        inflight = real(batch)
        wait = inflight.wait

        def timed() -> Any:
            result = wait()
            if max(batch.num_new) == 1:
                times.append(time.perf_counter() - t0)
            return result

        inflight.wait = timed
        return inflight

    runner.launch = launch
    return times


def decode_rows(llm: LLM, contexts: list[int], repeats: int) -> list[dict[str, Any]]:
    times = step_times(llm)
    params = SamplingParams(max_tokens=33, temperature=0.0, ignore_eos=True)
    rows = []
    for c in contexts:
        per = []
        for r in range(repeats):
            times.clear()
            llm.generate([ids(max(c, 1), r)], params)
            per.append(statistics.median(times))
        rows.append({"context": c, "decode_ms": statistics.median(per) * 1e3})
    return rows


def prefill_rows(llm: LLM, contexts: list[int], news: list[int], repeats: int) -> list[dict[str, Any]]:
    gr = llm.engine.core.runner.graph_runner
    assert gr is not None and gr.compiled is not None
    one = SamplingParams(max_tokens=1, temperature=0.0)
    rows = []
    for c in contexts:
        for n in news:
            ms: dict[bool, float] = {}
            for compiled in (True, False):
                per = []
                for r in range(repeats):
                    prefix, tail = ids(c, r), ids(n, 1000 + r)
                    llm.engine.core.blocks.reset_prefix_cache()
                    if c:
                        llm.generate([prefix], one)  # cached: the request below prefills the tail
                    gr.compiled.ready = compiled
                    try:
                        t0 = time.perf_counter()
                        llm.generate([prefix + tail], one)
                        per.append(time.perf_counter() - t0)
                    finally:
                        gr.compiled.ready = True
                ms[compiled] = statistics.median(per) * 1e3
            rows.append(
                {
                    "context": c,
                    "new": n,
                    "graph_ms": ms[True],
                    "eager_ms": ms[False],
                    "speedup": ms[False] / ms[True],
                }
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--contexts", type=int, nargs="+", default=[0, 128, 512, 1024])
    ap.add_argument("--new", type=int, nargs="+", default=[2, 9, 16, 64, 128])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], help="config override KEY=VALUE")
    ap.add_argument("--out", default="bench/out/context_cost.json")
    a = ap.parse_args()
    overrides = ["cache.num_blocks=1024", "scheduler.max_num_batched_tokens=4096", *a.set]
    with LLM(overrides=overrides) as llm:
        path = decode_path(llm)
        pre = prefill_rows(llm, a.contexts, a.new, a.repeats)
        dec = decode_rows(llm, [c for c in a.contexts if c] + [2048], a.repeats)
    rss = peak_rss_mib()
    write_json(
        a.out,
        {"decode_path": path, "overrides": overrides, "decode": dec, "prefill": pre, "peak_rss_mib": rss},
    )
    print(f"decode path {path}; peak RSS {rss:.0f} MiB")
    print(table(dec, ["context", "decode_ms"]))
    print()
    print(table(pre, ["context", "new", "graph_ms", "eager_ms", "speedup"]))


if __name__ == "__main__":
    main()
