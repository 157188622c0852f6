"""What deterministic inference costs: tokens/s with `engine.deterministic` on vs off, same run.

Two engines on the same model live in one process and are measured in turns (off, on, off, on,
...), best of `--reps` per cell, so that a noisy machine shifts both alike. Each cell is a batch
of B requests submitted together (random prompts of `--prompt-len` tokens, `--tokens` new tokens,
temperature 1 with a seed per request, EOS ignored): "tok/s" counts the generated tokens over the
whole batch's wall time (prefill included); "decode tok/s" takes the same batch's prefill time (a
run with max_tokens 1) out. MKL's strict reproducibility is requested before torch loads, as
`rillet serve` does for deterministic mode (it costs nothing measurable), so both engines run under it.

The off engine runs the default decode step (`graphs.enabled: auto`: the compiled step on CPU, once
its background compile is done, which this script waits for); `--off-graphs off` compares against
the eager step instead, i.e. the price of the invariant kernels alone. Deterministic mode always
serves the eager step.

    .venv/bin/python -m bench.engine.determinism_cost [--batch 1 16 64] [--tokens 64] [--prompt-len 128]
        [--reps 3] [--off-graphs auto|off] [--set section.key=value ...]
"""

from __future__ import annotations

import os

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")  # before torch: see core/determinism/mkl.py

import argparse
import random
import time
from typing import Any

import torch
from rillet.core.config import config_from_dict
from rillet.core.determinism.mkl import strict_in_force
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams

from bench.lib.common import decode_path, peak_rss_mib, table, write_json


def make_llm(deterministic: str, graphs: str, overrides: list[str]) -> LLM:
    cfg = config_from_dict(
        {
            "engine": {"deterministic": deterministic},
            "graphs": {"enabled": graphs},
            "cache": {"num_blocks": 1024, "prefix_caching": False},  # no hits between turns
            "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 8192},
        },
        overrides,
    )
    return LLM(cfg)


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(batch)]


def timed(llm: LLM, batch: list[list[int]], tokens: int) -> tuple[float, int]:
    params = [
        SamplingParams(max_tokens=tokens, temperature=1.0, seed=i, ignore_eos=True) for i in range(len(batch))
    ]
    t0 = time.perf_counter()
    outs = llm.generate(batch, params)
    return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)


def measure(llm: LLM, batch: list[list[int]], tokens: int) -> tuple[float, float]:
    """(tok/s over the whole batch, decode tok/s with the prefill's time taken out)."""
    prefill, _ = timed(llm, batch, 1)
    total, n = timed(llm, batch, tokens)
    decode = (n - len(batch)) / max(total - prefill, 1e-9)
    return n / total, decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--off-graphs", choices=["auto", "off"], default="auto")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--set", action="append", default=[], help="config override for both engines")
    ap.add_argument("--out", default="bench/out/determinism_cost.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    engines = {"on": make_llm("on", "off", a.set), "off": make_llm("off", a.off_graphs, a.set)}
    try:
        paths = {mode: decode_path(llm) for mode, llm in engines.items()}  # waits for a compile
        vocab = engines["on"].engine.runtime.arch.vocab_size  # type: ignore[union-attr]
        rows = [cell(engines, b, a, vocab) for b in a.batch]
    finally:
        for llm in engines.values():
            llm.close()
    rss = peak_rss_mib()
    for row in rows:
        row |= {"off_decode_path": paths["off"], "peak_rss_mib": rss}
    meta = {"tokens": a.tokens, "prompt_len": a.prompt_len, "reps": a.reps, "threads": a.threads}
    meta |= {"mkl_strict": strict_in_force(), "overrides": a.set}
    write_json(a.out, {**meta, "rows": rows})
    cols = ["batch", "off_decode_path", "off_tok_s", "on_tok_s", "cost", "off_decode_tok_s"]
    cols += ["on_decode_tok_s", "decode_cost", "peak_rss_mib"]
    print(table(rows, cols))


def cell(engines: dict[str, LLM], b: int, a: Any, vocab: int) -> dict[str, Any]:
    best: dict[str, tuple[float, float]] = {"off": (0.0, 0.0), "on": (0.0, 0.0)}
    for rep in range(a.reps + 1):  # the first turn warms up and is not counted
        for mode in ("off", "on"):
            got = measure(engines[mode], prompts(b, a.prompt_len, vocab, seed=rep), a.tokens)
            if rep:
                best[mode] = (max(best[mode][0], got[0]), max(best[mode][1], got[1]))
    (off, off_dec), (on, on_dec) = best["off"], best["on"]
    return {
        "batch": b,
        "off_tok_s": off,
        "on_tok_s": on,
        "cost": off / on,  # how many times longer the same tokens take with the mode on
        "off_decode_tok_s": off_dec,
        "on_decode_tok_s": on_dec,
        "decode_cost": off_dec / on_dec,
    }


if __name__ == "__main__":
    main()
