"""Constrained vs unconstrained decoding: tok/s at batch 1 / 16 / 64 with every row under a JSON
Schema grammar, against the same batch without one, and the per-step mask time.

The default model (its default quantization), offline API (no HTTP), greedy, a fixed number of new
tokens per row: unconstrained rows ignore EOS; constrained rows follow a schema that cannot end
before --tokens (an array of at least 200 small objects), so both sides generate the same count.
Rounds alternate constrained and unconstrained; each row of the table is the median round.
Mask time per step = bitmask fill (worker thread, overlapping the forward) + the sampler's wait for
it + unpacking and applying the bits. Target (issue 15): constrained >= 0.9x unconstrained at 16/64.
Constrained rows carry what the server gives a constrained request that sets no penalty
(`structured.repetition_penalty`, core/structured/defaults.py); `--set
structured.repetition_penalty=1.0` measures them without it.

    .venv/bin/python bench/structured_throughput.py [--tokens 64] [--batch 1 16 64] [--rounds 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from typing import Any

import torch
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams
from rillet.core.structured.defaults import constrained_penalty
from rillet.core.structured.spec import GrammarSpec

from bench.lib.common import decode_path, peak_rss_mib, table, write_json

SCHEMA = {
    "type": "object",
    "properties": {
        "records": {
            "type": "array",
            "minItems": 200,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "role": {"enum": ["admin", "editor", "viewer"]},
                },
                "required": ["name", "age", "role"],
            },
        }
    },
    "required": ["records"],
}


def prompts(batch: int, offset: int) -> list[str]:
    return [
        f"List people record number {offset + i} as JSON records with name, age and role."
        for i in range(batch)
    ]


def run_once(llm: LLM, batch: int, tokens: int, constrained: bool, offset: int) -> dict[str, Any]:
    grammar = GrammarSpec("json_schema", json.dumps(SCHEMA)) if constrained else None
    # what the server gives a constrained request that sets no penalty (structured.repetition_penalty)
    penalty = constrained_penalty({}, grammar, llm.engine.cfg.structured.repetition_penalty)
    params = SamplingParams(
        max_tokens=tokens, temperature=0.0, ignore_eos=not constrained, grammar=grammar, **penalty
    )
    masks = llm.engine.core.runner.masks  # type: ignore[attr-defined]
    names = ("steps", "fill_s", "wait_s", "apply_s", "check_s", "lazy_rows", "lazy_misses")
    before = dataclasses.asdict(masks.stats)
    t0 = time.perf_counter()
    outs = llm.generate(prompts(batch, offset), params)
    dt = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    delta = {k: getattr(masks.stats, k) - before[k] for k in names}
    steps = delta["steps"]

    def per_step(name: str) -> float:
        return delta[name] / max(steps, 1) * 1000

    if constrained:
        for o in outs:  # the grammar never let a row end early
            assert len(o.outputs[0].token_ids) == tokens, o.outputs[0].text
    return {
        "tok_s": n / dt,
        "tokens": n,
        "mask_steps": steps,
        "fill_ms": per_step("fill_s"),
        "wait_ms": per_step("wait_s"),
        "apply_ms": per_step("apply_s"),
        "check_ms": per_step("check_s"),  # lazy rows: validating tokens, filling the misses
        "lazy_rows": delta["lazy_rows"],
        "lazy_misses": delta["lazy_misses"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], help="rillet config override")
    ap.add_argument("--out", default="bench/out/structured_throughput.json")
    a = ap.parse_args()
    cfg = config_from_dict({"model": {"device": "cpu"}, "cache": {"num_blocks": 2048}}, a.set)
    rows: list[dict[str, Any]] = []
    offset = 0
    with LLM(cfg) as llm:
        assert llm.engine.grammars is not None, (
            "llguidance is not installed (pip install 'rillet[structured]')"
        )
        path = decode_path(llm)  # the compiled step is built in the background: measure what stays
        run_once(llm, 4, 8, True, 10_000)  # warm-up: grammar tokenizer, compile, first steps
        run_once(llm, 4, 8, False, 10_001)
        for batch in a.batch:
            runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
            for r in range(a.rounds):
                order = (False, True) if r % 2 == 0 else (True, False)
                for constrained in order:
                    offset += batch
                    runs[constrained].append(run_once(llm, batch, a.tokens, constrained, offset))
            free = statistics.median(x["tok_s"] for x in runs[False])
            con = statistics.median(x["tok_s"] for x in runs[True])
            m = runs[True]
            misses = sum(x["lazy_misses"] for x in m)
            rows.append(
                {
                    "batch": batch,
                    "unconstrained_tok_s": free,
                    "constrained_tok_s": con,
                    "ratio": con / free,
                    "fill_ms_per_step": statistics.median(x["fill_ms"] for x in m),
                    "wait_ms_per_step": statistics.median(x["wait_ms"] for x in m),
                    "apply_ms_per_step": statistics.median(x["apply_ms"] for x in m),
                    "check_ms_per_step": statistics.median(x["check_ms"] for x in m),
                    "lazy_miss_rate": misses / max(1, sum(x["lazy_rows"] for x in m)),
                    "step_ms": 1000 * batch / con,
                    "runs": runs[False] + runs[True],
                }
            )
    rss = peak_rss_mib()
    for row in rows:
        row["peak_rss_mib"] = rss
    write_json(
        a.out,
        {
            "tokens": a.tokens,
            "rounds": a.rounds,
            "threads": torch.get_num_threads(),
            "decode": path,
            "rows": rows,
        },
    )
    cols = [
        "batch",
        "unconstrained_tok_s",
        "constrained_tok_s",
        "ratio",
        "fill_ms_per_step",
        "wait_ms_per_step",
        "apply_ms_per_step",
        "check_ms_per_step",
        "lazy_miss_rate",
        "step_ms",
        "peak_rss_mib",
    ]
    print(table(rows, cols))


if __name__ == "__main__":
    main()
