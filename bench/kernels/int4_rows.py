"""One int4 projection by rows: torch's `_weight_int4pack_mm_for_cpu` against rillet's own kernel
(core/quant/rows_kernel.py), the same codes in each one's layout, on the default model's shapes.

Each variant cycles through `--matrices` weights per call (~9 MB of codes for [1536, 576], as a
decode step's other layers evict them), the variants interleaved call by call so that a drifting
host shifts them alike; reports the interquartile mean per matrix, the ratio, and the peak RSS.

    .venv/bin/python -m bench.kernels.int4_rows
    .venv/bin/python -m bench.kernels.int4_rows --threads 1 2 --rows 1 5 9
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from rillet.core.quant import rows_kernel
from rillet.core.quant.int4 import Int4Weight

from bench.lib.common import machine, peak_rss_mib, table, write_json

SHAPES = [(1536, 576), (576, 1536), (3072, 576), (640, 576)]  # [N, K]: up, down, gate+up, qkv


def iq_mean(xs: list[float]) -> float:
    xs = sorted(xs)
    q = len(xs) // 4
    return statistics.fmean(xs[q : len(xs) - q] or xs)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cell(n: int, k: int, rows: int, matrices: int, calls: int) -> dict[str, Any]:
    weights = [torch.randn(n, k) for _ in range(matrices)]
    variants = {
        "torch": [Int4Weight(w, rows=False) for w in weights],
        "rillet": [Int4Weight(w, rows=True) for w in weights],
    }
    x = torch.randn(rows, k).bfloat16()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(calls + 3):
        for name, ws in variants.items():
            t = timed(lambda ws=ws: [w(x) for w in ws])
            if i >= 3:  # warm-up calls
                times[name].append(t / matrices * 1e6)
    torch_us, rillet_us = iq_mean(times["torch"]), iq_mean(times["rillet"])
    return {
        "shape": f"{n}x{k}",
        "rows": rows,
        "torch_us": round(torch_us, 1),
        "rillet_us": round(rillet_us, 1),
        "speedup": round(torch_us / rillet_us, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 5, 8, 9, 12, 16])
    ap.add_argument("--threads", nargs="+", type=int, default=[1])
    ap.add_argument("--matrices", type=int, default=24)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--out", default="bench/out/int4_rows.json")
    a = ap.parse_args()
    if not rows_kernel.available():
        raise SystemExit("rillet's int4 kernel does not run here (AVX512-BF16 and a C++ compiler needed)")
    results = []
    for threads in a.threads:
        torch.set_num_threads(threads)
        for n, k in SHAPES:
            for rows in a.rows:
                results.append({"threads": threads, **cell(n, k, rows, a.matrices, a.calls)})
    write_json(a.out, {"machine": machine(), "peak_rss_mib": peak_rss_mib(), "rows": results})
    print(f"us per matrix, interquartile mean of {a.calls} calls over {a.matrices} matrices; "
          f"peak RSS {peak_rss_mib():.0f} MiB")  # fmt: skip
    print(table(results, ["threads", "shape", "rows", "torch_us", "rillet_us", "speedup"]))


if __name__ == "__main__":
    main()
