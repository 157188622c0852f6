"""What one saved decode or verify step costs per row count: the small-batch step (aten's GEMMs,
`graphs.small_batch`) against the general (autotuned) one, and the verify step per query count.

Which GEMM kernels win at few rows depends on the CPU (Inductor's AMX template on an AMX Xeon, its
AVX-512 weight-only int4 template elsewhere, aten's int4 kernel) and decides `graphs.small_batch`'s
default and issue 28's draft lengths (`speculative.row_cost`). Every step is called directly on
static inputs of the given context (no scheduler, no sampling, no HTTP), on the engine thread
(inside one of its decode steps: torch's CPU thread pool belongs to the thread that built the model,
and the same step called from another thread ran ~5x slower here), the variants interleaved call by
call so that a drifting host shifts them alike; reports each one's interquartile mean.

    .venv/bin/python -m bench.kernels.step_rows                       # rows 1..8, context 256
    .venv/bin/python -m bench.kernels.step_rows --rows 1 2 4 --queries 2 4 9 --context 512
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams
from rillet.graphs.aot.step import ByRows
from rillet.graphs.static_buffers import StaticBuffers
from rillet.graphs.verify import VerifyBuffers

from bench.lib.common import decode_path, peak_rss_mib, table, write_json


def iq_mean(xs: list[float]) -> float:
    xs = sorted(xs)
    q = len(xs) // 4
    return statistics.fmean(xs[q : len(xs) - q] or xs)


def at_context(batch: Any, context: int) -> Any:
    """The padding batch with every row at `context` tokens: its attention reads that many (the
    pad block over and over; the values do not matter for the cost), its K/V goes to the pad slot."""
    batch.seq_lens.fill_(context)
    batch.positions.fill_(context - 1)
    return batch


def timed(
    steps: dict[str, Callable[[], Any]], calls: int, scrub: torch.Tensor | None = None
) -> dict[str, float]:
    """ms per call of each step, interleaved call by call (after two warm-up calls each).
    `scrub`: a buffer written before every timed call, so the call finds the caches as a step in
    the engine does (the LM head's ~56 MB and the other step's weights went through them since)."""
    got: dict[str, list[float]] = {k: [] for k in steps}
    with torch.inference_mode():
        for _ in range(2):
            for fn in steps.values():
                fn()
        for _ in range(calls):
            for name, fn in steps.items():
                if scrub is not None:
                    scrub.add_(1)
                t0 = time.perf_counter()
                fn()
                got[name].append((time.perf_counter() - t0) * 1e3)
    return {k: round(iq_mean(v), 3) for k, v in got.items()}


def on_engine_thread(llm: LLM, compiled: Any, work: Callable[[], Any]) -> Any:
    """`work()`, run on the engine thread at its next decode step (then the step itself)."""
    fn = compiled.fn
    got: list[Any] = []

    def once(batch: Any) -> Any:
        compiled.fn = fn
        got.append(work())
        return fn(batch)

    compiled.fn = once
    llm.generate(["Hello"], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    if not got:
        raise SystemExit("the engine ran no decode step through the saved step")
    return got[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 3, 4, 5, 6, 8])
    ap.add_argument("--queries", nargs="+", type=int, default=[2, 3, 4, 5, 7, 9], help="verify, batch 1")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--cold-mib", type=int, default=0, help="write a buffer this large before each call")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="config override k=v")
    ap.add_argument("--out", default="bench/out/step_rows.json")
    args = ap.parse_args()
    k = max(args.queries) - 1
    over = [
        "speculative.method=ngram",
        f"speculative.num_tokens={k}",
        "speculative.max_batch=1",
        "graphs.small_batch=4",  # both steps on any CPU (auto builds the small one on AMX only)
        *args.sets,
    ]
    with LLM(overrides=over) as llm:
        decode_path(llm)
        width = -(-args.context // llm.engine.cfg.cache.block_size) + 1  # blocks a row's table holds
        compiled = llm.engine.core.runner.graph_runner.compiled  # type: ignore[attr-defined]
        fn = compiled.fn
        if not isinstance(fn, ByRows):
            raise SystemExit(f"no small-batch step in use (the decode step is {type(fn).__name__})")
        rows_out = on_engine_thread(llm, compiled, lambda: measure(compiled, fn, args, width))
    rss = peak_rss_mib()
    cold = f"; {args.cold_mib} MiB written before each call" if args.cold_mib else ""
    where = f"context {args.context}{cold}"
    print(f"ms per call, interquartile mean of {args.calls}; {where}; peak RSS {rss:.0f} MiB")
    print(table(rows_out, ["step", "rows", "small", "general", "small_vs_general"]))
    write_json(args.out, {"args": vars(args), "rows": rows_out, "peak_rss_mib": rss})


def measure(compiled: Any, fn: ByRows, args: argparse.Namespace, width: int) -> list[dict[str, Any]]:
    device = torch.device("cpu")
    dec = StaticBuffers.allocate(max(args.rows), width, device)
    rows_out: list[dict[str, Any]] = []
    scrub = torch.zeros(args.cold_mib << 18) if args.cold_mib else None  # float32: 4 bytes each
    for r in args.rows:
        batch = at_context(dec.padding(r, width), args.context)
        ms = timed(
            {"small": lambda b=batch: fn.small(b), "general": lambda b=batch: fn.general(b)},
            args.calls,
            scrub,
        )
        ratio = round(ms["small"] / ms["general"], 3)
        rows_out.append({"step": "decode", "rows": r, **ms, "small_vs_general": ratio})
    ver = VerifyBuffers.allocate(1, max(args.queries), width, device)
    verify = compiled.verify
    for q in args.queries:
        vb = ver.padding(1, width, q)
        # one row at `context` tokens before its q queries (the last token and q - 1 drafts)
        vb.query_lens.fill_(q)
        vb.query_lens_cpu[0] = q
        vb.seq_lens.fill_(args.context + q - 1)
        vb.seq_lens_cpu[0] = args.context + q - 1
        vb.positions.copy_(torch.arange(args.context - 1, args.context - 1 + q).view(1, q))
        ms = timed({"general": lambda b=vb: verify.fn(b)}, args.calls, scrub)
        rows_out.append({"step": "verify", "rows": q, "small": None, **ms, "small_vs_general": None})
    return rows_out


if __name__ == "__main__":
    main()
