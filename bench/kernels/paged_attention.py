"""One layer's paged attention in the compiled CPU steps: rillet's kernel (core/attention/
cpu_kernel.py) against the GEMM path it replaces (paged_decode.py `gemms_over_context`, compiled
by torch.compile with dynamic shapes first traced at 2 rows, as the saved steps are), on the
default model's heads (9 query heads over 3 kv heads of 64) by default.

Each case is a batch of rows with `--context` cached tokens over a shuffled pool and Q queries a
row (Q = 1: a decode step; more: a verify step's last token and drafts); the variants are
interleaved call by call so that a drifting host shifts them alike. Reports the interquartile
mean per call, the ratio, the largest difference between the two outputs, and the peak RSS.

    .venv/bin/python -m bench.kernels.paged_attention
    .venv/bin/python -m bench.kernels.paged_attention --cases 1x1 1x9 8x1 --context 1024 --threads 1
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from rillet.core.attention import cpu_kernel, paged_verify
from rillet.core.attention.base import VerifyMetadata

from bench.lib.common import machine, peak_rss_mib, table, write_json

BS = 16


def iq_mean(xs: list[float]) -> float:
    xs = sorted(xs)
    q = len(xs) // 4
    return statistics.fmean(xs[q : len(xs) - q] or xs)


def case(rows: int, nq: int, context: int, hq: int, hkv: int, d: int, seed: int = 0) -> tuple[Any, ...]:
    """q [B * Q, Hq, D], the pool, and a VerifyMetadata of B rows whose Q queries end at `context`."""
    gen = torch.Generator().manual_seed(seed)
    width = -(-context // BS)
    blocks = rows * width + 1
    k_cache, v_cache = (torch.randn(blocks, BS, hkv, d, generator=gen) for _ in "kv")
    pool = list(range(1, blocks))
    random.Random(seed).shuffle(pool)
    tables = torch.tensor(pool, dtype=torch.int32).view(rows, width)
    seq_lens = torch.full((rows,), context, dtype=torch.int32)
    query_lens = torch.full((rows,), nq, dtype=torch.int32)
    slots = torch.zeros(rows, nq, dtype=torch.int64)  # unused: no K/V is written here
    q = torch.randn(rows * nq, hq, d, generator=gen)
    return q, k_cache, v_cache, VerifyMetadata(slots, seq_lens, query_lens, tables)


def gemm_path(k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float) -> Callable[..., torch.Tensor]:
    def attend(
        q: torch.Tensor, slots: torch.Tensor, lens: torch.Tensor, qlens: torch.Tensor, tables: torch.Tensor
    ):
        return paged_verify._attend_gathered(
            q, k_cache, v_cache, VerifyMetadata(slots, lens, qlens, tables), scale
        )

    return torch.compile(attend, fullgraph=True, dynamic=True)


def measure(args: argparse.Namespace, rows: int, nq: int) -> dict[str, Any]:
    hq, hkv, d = args.heads
    q, kc, vc, meta = case(rows, nq, args.context, hq, hkv, d)
    scale = d**-0.5
    torch._dynamo.reset()  # each case's compiled function closes over its own pool
    compiled = gemm_path(kc, vc, scale)
    warm = case(2, 5, 3 * BS, hq, hkv, d)  # the saved steps' example: 2 rows (graphs/verify.py)
    compiled(warm[0], warm[3].slot_mapping, warm[3].seq_lens, warm[3].query_lens, warm[3].block_tables)
    m = meta

    def gemms() -> torch.Tensor:
        return compiled(q, m.slot_mapping, m.seq_lens, m.query_lens, m.block_tables)

    def kernel() -> torch.Tensor:
        return cpu_kernel.attend(q.view(rows, nq, hq, d), kc, vc, m, scale, None).view(rows * nq, hq, d)

    diff = (gemms() - kernel()).abs().max().item()
    got: dict[str, list[float]] = {"gemms": [], "kernel": []}
    with torch.inference_mode():
        for _ in range(args.calls):
            for name, fn in (("gemms", gemms), ("kernel", kernel)):
                start = time.perf_counter()
                fn()
                got[name].append((time.perf_counter() - start) * 1e6)
    us = {k: round(iq_mean(v), 1) for k, v in got.items()}
    ratio = round(us["gemms"] / us["kernel"], 2)
    return {
        "rows": rows,
        "queries": nq,
        "context": args.context,
        **us,
        "speedup": ratio,
        "max_diff": f"{diff:.1e}",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=["1x1", "1x2", "1x9", "1x16", "4x9", "8x1", "32x1"])
    ap.add_argument("--context", type=int, default=272, help="cached tokens a row")
    ap.add_argument("--heads", type=int, nargs=3, default=[9, 3, 64], metavar=("HQ", "HKV", "D"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--out", default="bench/out/paged_attention.json")
    args = ap.parse_args()
    if not cpu_kernel.available():
        raise SystemExit(
            "rillet's paged attention kernel does not run here (no AVX-512, or it did not build)"
        )
    torch.set_num_threads(args.threads)
    rows_out = [measure(args, *map(int, c.split("x"))) for c in args.cases]
    rss = peak_rss_mib()
    print(f"us a layer, interquartile mean of {args.calls}; {args.threads} threads; peak RSS {rss:.0f} MiB")
    print(table(rows_out, ["rows", "queries", "context", "gemms", "kernel", "speedup", "max_diff"]))
    write_json(args.out, {"args": vars(args), "machine": machine(), "rows": rows_out, "peak_rss_mib": rss})


if __name__ == "__main__":
    main()
