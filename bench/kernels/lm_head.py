"""The default model's LM head by rows: the full head (torch's weight-only int8 kernel with bf16
activations, then the exact top 16: what sampled rows get) against the candidate passes plain
greedy rows get (their tokens from the exact logits of 16 candidates): oneDNN int8 x int8
(core/quant/candidate_head.py) and, where rillet's int4 kernel runs, the head's int4 copy that
batches of few rows take (core/quant/int4_candidates.py); with the head's weights hot in cache
and evicted (a 64 MiB buffer written between calls, as a decode step's other weights do).

Accuracy on the model's own hidden states (the greedy answers to the first 16 chat prompts of
tests/data/chat_prompts.json): each approximation's error against the Q8_0 weights' float64
logits, the worst rank it gives a row's best token (16 candidates are taken), and whether each
row's argmax is the exact one.

    .venv/bin/python -m bench.kernels.lm_head
    .venv/bin/python -m bench.kernels.lm_head --threads 1 2 --rows 1 4 9 16

Prints the tables last and writes JSON (with the process's peak RSS).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.model.decoder import DecoderModel
from rillet.core.quant.int4 import Int8Weight
from rillet.core.quant.int4_candidates import ROWS_PER_THREAD, Int4Candidates
from rillet.core.sampling_params import SamplingParams

from bench.lib.common import peak_rss_mib, table, write_json

PROMPTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "chat_prompts.json"


def capture(n_prompts: int) -> tuple[Int8Weight, torch.Tensor]:
    """The default model's int8 head and the hidden rows its greedy answers computed logits of."""
    rows: list[torch.Tensor] = []
    real = DecoderModel.greedy_tokens

    def spy(self: DecoderModel, hidden: torch.Tensor) -> torch.Tensor:  # greedy rows take it
        rows.append(hidden.detach().float().clone())
        return real(self, hidden)

    DecoderModel.greedy_tokens = spy  # type: ignore[method-assign]
    prompts = json.loads(PROMPTS.read_text())[:n_prompts]
    cfg = config_from_dict({"graphs": {"enabled": False}})
    try:
        with LLM(cfg) as llm:
            tok = llm.tokenizer
            chats = [
                tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
                for p in prompts
            ]
            llm.generate(chats, SamplingParams(max_tokens=48, temperature=0.0))
            head = llm.engine.core.runner.model.quant_head  # type: ignore[attr-defined]
    finally:
        DecoderModel.greedy_tokens = real  # type: ignore[method-assign]
    assert isinstance(head, Int8Weight), "the default model's head is int8 on CPU"
    return head, torch.cat(rows)


def timed(fn: Callable[[], Any], cold: bool, junk: torch.Tensor, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if cold:
            junk.add_(1)  # evicts the head's 28 MB from the caches
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _full(head: Int8Weight, x: torch.Tensor) -> torch.Tensor:
    return head.refine(x, head(x).float())


@contextmanager
def _int4_pass(head: Int8Weight, int4: Int4Candidates | None) -> Iterator[None]:
    """The head with the int4 pass given (None: oneDNN's int8 pass whatever the rows)."""
    keep = head.int4_candidates
    head.int4_candidates = int4
    try:
        yield
    finally:
        head.int4_candidates = keep


def _tokens_through(head: Int8Weight, int4: Int4Candidates | None, x: torch.Tensor) -> torch.Tensor:
    with _int4_pass(head, int4):
        return head.candidate_tokens(x)


def speed_rows(
    head: Int8Weight, x: torch.Tensor, threads: list[int], rows: list[int], repeats: int
) -> list[dict[str, Any]]:
    """ms per call: the full head, and greedy tokens through oneDNN's int8 pass and through the
    head's int4 copy (whatever the rows: Int4Candidates.takes says which one the engine takes)."""
    junk = torch.zeros(64 << 20, dtype=torch.uint8)
    int4 = head.int4_candidates
    out = []
    for t in threads:
        torch.set_num_threads(t)
        for m in rows:
            xm = x[:m].contiguous()
            fns = {"full": partial(_full, head, xm)}
            if head.candidate_head is not None:
                fns["int8_pass"] = partial(_tokens_through, head, None, xm)
            if int4 is not None:
                fns["int4_pass"] = partial(_tokens_through, head, _Always(int4), xm)
            row: dict[str, Any] = {"threads": t, "rows": m}
            for cold in (False, True):
                tag = "cold" if cold else "hot"
                for name, fn in fns.items():
                    row[f"{name}_{tag}_ms"] = round(timed(fn, cold, junk, repeats), 3)
            if int4 is not None:
                row["engine_takes"] = "int4" if int4.takes(m) else "int8"
            out.append(row)
    return out


class _Always(Int4Candidates):
    """An int4 pass that takes any number of rows (to time it past the engine's limit)."""

    def __init__(self, inner: Int4Candidates) -> None:
        self.__dict__.update(inner.__dict__)

    def takes(self, rows: int) -> bool:
        return True


def accuracy(head: Int8Weight, x: torch.Tensor) -> list[dict[str, Any]]:
    """One row per approximation: its error against the Q8_0 weights' logits, how often the exact
    best token is its top 1 / in its top 16, and how often the final logits' argmax misses it."""
    exact = x.double() @ (head.codes.double() * head.scales.double()[..., None]).flatten(1).t()
    best = exact.argmax(-1)

    def row(name: str, approx: torch.Tensor, final: torch.Tensor) -> dict[str, Any]:
        err = (approx.double() - exact).abs()
        return {
            "approximation": name,
            "mean_err": round(err.mean().item(), 4),
            "max_err": round(err.max().item(), 3),
            "top1_misses": int((approx.argmax(-1) != best).sum()),
            "top16_misses": int((~(approx.topk(16, -1).indices == best[:, None]).any(-1)).sum()),
            "worst_rank_of_best": int((approx > approx.gather(1, best[:, None])).sum(1).max()) + 1,
            "final_argmax_misses": int((final.argmax(-1) != best).sum()),
            "rows": len(x),
        }

    full = head(x).float()
    out = [row("bf16 kernel (full head)", full, head.refine(x, full))]
    if head.candidate_head is not None:
        out.append(row("oneDNN int8 (candidates)", head.candidate_head(x), head.candidate_logits(x)))
    if head.int4_candidates is not None:
        int4 = _Always(head.int4_candidates)
        with _int4_pass(head, int4):
            out.append(row("rillet int4 (candidates, few rows)", int4(x), head.candidate_logits(x)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", nargs="+", type=int, default=[2, 1])
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 5, 8, 9, 16])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default="bench/results/lm_head.json")
    args = ap.parse_args()
    head, x = capture(args.prompts)
    acc = accuracy(head, x)
    speed = speed_rows(head, x, args.threads, args.rows, args.repeats)
    rss = peak_rss_mib()
    kind = "oneDNN int8" if head.candidate_head is not None else "none (bf16 kernel)"
    if head.int4_candidates is not None:
        kind += f", rillet int4 up to {ROWS_PER_THREAD} rows a thread"
    print(f"candidate head: {kind}; peak RSS {rss:.0f} MiB")
    print(table(acc, list(acc[0])))
    print(table(speed, list(speed[0])))
    write_json(args.out, {"args": vars(args), "accuracy": acc, "speed": speed, "peak_rss_mib": rss})


if __name__ == "__main__":
    main()
