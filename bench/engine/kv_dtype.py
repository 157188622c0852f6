"""What a quantized KV pool buys and costs: float32 vs int8 (`cache.dtype`) at the same memory budget.

Each pool dtype runs in a process of its own (its peak RSS is its own), on the default model as
served (graphs auto: the compiled decode step, waited for), prefix caching off (no hits between
repetitions). Per dtype:
  tokens     the tokens the pool holds at `--memory-gb` (blocks x block size)
  c64        `--concurrency` requests of `--context` random prompt tokens each, `--tokens` new
             tokens (EOS ignored), submitted together: generated tokens / wall time, and decode
             tok/s with the prefill's time (a run with max_tokens 1) taken out. A pool too small
             for all of them at once queues or preempts: that is the point of the comparison;
             `fits` says whether concurrency x (context + tokens) fit the pool.
  batch 1    one request (`--b1-prompt` tokens, `--b1-tokens` new): decode tok/s (the int8 pool's
             dequantization must cost at most 5 % here)
Best of `--reps` (after a warm-up turn). The table is printed last; JSON to `--out`.

    .venv/bin/python -m bench.engine.kv_dtype [--dtypes float32 int8] [--memory-gb 1.0]
        [--context 1000] [--concurrency 64] [--tokens 64] [--reps 2] [--quick] [--set k=v ...]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from typing import Any

from bench.lib.common import REPO, decode_path, peak_rss_mib, table, write_json


def _llm(dtype: str, memory_gb: float, a: argparse.Namespace) -> Any:
    from rillet.core.config import config_from_dict
    from rillet.core.llm import LLM

    cfg = config_from_dict(
        {
            "cache": {"dtype": dtype, "memory_gb": memory_gb, "prefix_caching": False},
            "scheduler": {"max_num_seqs": max(64, a.concurrency)},
        },
        a.set,
    )
    return LLM(cfg)


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def _timed(llm: Any, batch: list[list[int]], tokens: int) -> tuple[float, int]:
    from rillet.core.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(batch, params)
    return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)


def _cell(llm: Any, n: int, length: int, tokens: int, reps: int, vocab: int) -> dict[str, float]:
    """Best (tok/s, decode tok/s) over `reps` turns after a warm-up turn."""
    best = {"tok_s": 0.0, "decode_tok_s": 0.0}
    for rep in range(reps + 1):
        batch = _prompts(n, length, vocab, seed=rep)
        prefill, _ = _timed(llm, batch, 1)
        total, got = _timed(llm, batch, tokens)
        if rep:
            best["tok_s"] = max(best["tok_s"], got / total)
            best["decode_tok_s"] = max(best["decode_tok_s"], (got - n) / max(total - prefill, 1e-9))
    return best


def child(dtype: str, a: argparse.Namespace) -> dict[str, Any]:
    """One pool dtype, measured in this process."""
    llm = _llm(dtype, a.memory_gb, a)
    try:
        path = decode_path(llm)  # waits for the background compile
        stats = llm.engine.stats()
        vocab = llm.engine.runtime.arch.vocab_size
        cc = _cell(llm, a.concurrency, a.context, a.tokens, a.reps, vocab)
        b1 = _cell(llm, 1, a.b1_prompt, a.b1_tokens, a.reps, vocab)
    finally:
        llm.close()
    return {
        "dtype": dtype,
        "decode_path": path,
        "blocks": stats.kv_blocks_total,
        "tokens": stats.kv_tokens_total,
        "fits": a.concurrency * (a.context + a.tokens) <= stats.kv_tokens_total,
        "c_tok_s": cc["tok_s"],
        "c_decode_tok_s": cc["decode_tok_s"],
        "b1_decode_tok_s": b1["decode_tok_s"],
        "peak_rss_mib": peak_rss_mib(),
    }


def _run_child(dtype: str, argv: list[str]) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "bench.engine.kv_dtype", *argv, "--child", dtype],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise SystemExit(f"{dtype} run failed:\n{r.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return row


def parse() -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "int8"])
    ap.add_argument("--memory-gb", type=float, default=1.0, help="cache.memory_gb of every run")
    ap.add_argument("--context", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--b1-prompt", type=int, default=128)
    ap.add_argument("--b1-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: proves the script runs")
    ap.add_argument("--set", action="append", default=[], help="config override of every run")
    ap.add_argument("--out", default="bench/out/kv_dtype.json")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    a = ap.parse_args(argv)
    if a.quick:  # small enough for a loaded 2-core box; the eager step (no compile to wait for)
        a.memory_gb, a.context, a.concurrency, a.tokens = 0.02, 48, 4, 4
        a.b1_prompt, a.b1_tokens, a.reps = 16, 8, 1
        a.set = ["graphs.enabled=off", *a.set]
    return a, argv


def main() -> None:
    a, argv = parse()
    if a.child is not None:
        print(json.dumps(child(a.child, a)))
        return
    rows = [_run_child(d, argv) for d in a.dtypes]
    base = rows[0]
    for r in rows:
        r["tokens_x"] = r["tokens"] / base["tokens"]
        r["b1_vs_first"] = r["b1_decode_tok_s"] / base["b1_decode_tok_s"]
    sizes = {"memory_gb": a.memory_gb, "context": a.context, "concurrency": a.concurrency}
    sizes |= {"tokens": a.tokens, "b1_prompt": a.b1_prompt, "b1_tokens": a.b1_tokens, "reps": a.reps}
    write_json(a.out, {**sizes, "overrides": a.set, "rows": rows})
    cols = ["dtype", "decode_path", "blocks", "tokens", "tokens_x", "fits", "c_tok_s", "c_decode_tok_s"]
    cols += ["b1_decode_tok_s", "b1_vs_first", "peak_rss_mib"]
    print(f"memory_gb {a.memory_gb}; c = {a.concurrency} x {a.context}-token prompts, {a.tokens} new tokens")
    print(table(rows, cols))


if __name__ == "__main__":
    main()
