"""One int4 projection by rows: torch's `_weight_int4pack_mm_for_cpu` against rillet's AVX2 kernel
(core/quant/avx2_kernel.py: int8 activations), the same codes in each one's layout, on the default
model's shapes; and the LM head's candidate pass (`--head`): torch's int8 kernel (bf16
activations, what greedy rows take where oneDNN's int8 GEMM is not exact) against the int4 copy
through the AVX2 kernel (core/quant/int4_candidates.py).

Measure it where ATen's capability is AVX2 (an AVX2 CPU, or under the cap):

    env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        .venv/bin/python -m bench.kernels.int4_avx2 --threads 1 2 [--head]

Each variant cycles through `--matrices` weights per call (as a decode step's other layers evict
them), the variants interleaved call by call; reports the interquartile mean per matrix, the
ratio, and the peak RSS.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from rillet.core.quant import avx2_kernel
from rillet.core.quant.int4 import Int4Weight, Int8Weight
from rillet.core.quant.int4_candidates import Int4Candidates
from torch import nn

from bench.kernels.int4_rows import iq_mean, timed
from bench.lib.common import machine, peak_rss_mib, table, write_json

SHAPES = [(1536, 576), (576, 1536), (576, 576)]  # [N, K]: up, down, attention output
HEAD = (49152, 576)  # the default model's vocabulary x hidden


def cell(variants: dict[str, list[Any]], n: int, k: int, rows: int, calls: int) -> dict[str, Any]:
    x = torch.randn(rows, k)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(calls + 3):
        for name, ws in variants.items():
            t = timed(lambda ws=ws: [w(x) for w in ws])
            if i >= 3:  # warm-up calls
                times[name].append(t / len(ws) * 1e6)
    torch_us, rillet_us = iq_mean(times["torch"]), iq_mean(times["rillet"])
    return {
        "shape": f"{n}x{k}",
        "rows": rows,
        "torch_us": round(torch_us, 1),
        "rillet_us": round(rillet_us, 1),
        "speedup": round(torch_us / rillet_us, 2),
    }


def projections(n: int, k: int, matrices: int) -> dict[str, list[Any]]:
    weights = [torch.randn(n, k) for _ in range(matrices)]
    return {
        "torch": [Int4Weight(w, rows=False) for w in weights],
        "rillet": [Int4Weight(w, avx2=True) for w in weights],
    }


def heads(n: int, k: int) -> dict[str, list[Any]]:
    head = Int8Weight(torch.randn(n, k) * 0.05)
    int4 = Int4Candidates(head.codes, head.scales, avx2=True)
    full: nn.Module = head
    return {"torch": [lambda x: full(x).float()], "rillet": [int4]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--matrices", type=int, default=24)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--head", action="store_true", help="the LM head's candidate pass too")
    ap.add_argument("--out", default="bench/out/int4_avx2.json")
    a = ap.parse_args()
    if not avx2_kernel.available():
        raise SystemExit("rillet's AVX2 int4 kernel does not run here (AVX2 and a C++ compiler needed)")
    cases = [(n, k, projections(n, k, a.matrices)) for n, k in SHAPES]
    if a.head:
        cases.append((*HEAD, heads(*HEAD)))
    results = []
    for threads in a.threads:
        torch.set_num_threads(threads)
        for n, k, variants in cases:
            for rows in a.rows:
                results.append({"threads": threads, **cell(variants, n, k, rows, a.calls)})
    info = {"machine": machine(), "capability": torch.backends.cpu.get_cpu_capability()}
    write_json(a.out, {**info, "peak_rss_mib": peak_rss_mib(), "rows": results})
    print(f"ATen capability {info['capability']}; us per matrix, interquartile mean of {a.calls} calls "
          f"over {a.matrices} matrices (the head: one); peak RSS {peak_rss_mib():.0f} MiB")  # fmt: skip
    print(table(results, ["threads", "shape", "rows", "torch_us", "rillet_us", "speedup"]))


if __name__ == "__main__":
    main()
