"""Constrained quality, not speed: does the model finish valid JSON under each layout?

30 JSON tasks (json_object prompts and JSON Schemas of several shapes), each run greedy and at
T = 0.7 with three seeds, offline on the default model: the share of answers that finish with
`stop` and parse (and validate against their schema), and the mean output length, under
`structured.whitespace` compact vs flexible, beside the unconstrained answers (their first
fenced ```json block, or the whole text, parsed: how often the model gets it right by itself).
Constrained requests get what the server gives one that sets no penalty: the repetition penalty
`structured.repetition_penalty` (core/structured/defaults.py); `--set
structured.repetition_penalty=1.0` measures them without it.
The tasks and how an answer is judged are in bench/lib/structured_tasks.py.

    .venv/bin/python -m bench.engine.structured_quality [--modes compact flexible none] [--max-tokens 400]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench.lib.common import OUT, peak_rss_mib, table, write_json
from bench.lib.structured_tasks import parses, tasks


def run_mode(mode: str, max_tokens: int, sets: list[str]) -> list[dict[str, Any]]:
    from rillet.core.llm import LLM
    from rillet.core.sampling_params import SamplingParams
    from rillet.core.sequence import FinishReason
    from rillet.core.structured.defaults import constrained_penalty
    from rillet.core.structured.spec import GrammarSpec

    whitespace = "compact" if mode == "none" else mode
    rows = []
    with LLM(overrides=[f"structured.whitespace={whitespace}", *sets]) as llm:
        tok = llm.tokenizer
        todo = tasks()
        prompts = [
            tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]), add_special_tokens=False)
            for p, _ in todo
        ]
        for label, temperature, seed in [("greedy", 0.0, None), *((f"T0.7 s{s}", 0.7, s) for s in (1, 2, 3))]:
            params = []
            for _, schema in todo:
                grammar = None
                if mode != "none":
                    grammar = (
                        GrammarSpec("json_object")
                        if schema is None
                        else GrammarSpec("json_schema", json.dumps(schema))
                    )
                # what the server gives a request that sets no penalty (structured.repetition_penalty)
                penalty = constrained_penalty({}, grammar, llm.engine.cfg.structured.repetition_penalty)
                params.append(
                    SamplingParams(
                        max_tokens=max_tokens, temperature=temperature, seed=seed, grammar=grammar, **penalty
                    )
                )
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params)
            wall = time.perf_counter() - t0
            ok = lengths = 0
            details = []
            for k, ((_, schema), out) in enumerate(zip(todo, outs, strict=True)):
                o = out.outputs[0]
                lengths += len(o.token_ids)
                good = o.finish_reason is FinishReason.STOP and parses(o.text, schema, mode != "none")
                ok += good
                reason = o.finish_reason.value if o.finish_reason else None
                details.append(
                    {
                        "task": k,
                        "ok": good,
                        "finish": reason,
                        "tokens": len(o.token_ids),
                        "text": o.text[:300],
                    }
                )
            rows.append(
                {
                    "mode": mode,
                    "run": label,
                    "ok": ok,
                    "tasks": len(todo),
                    "ok_share": ok / len(todo),
                    "mean_tokens": lengths / len(todo),
                    "wall_s": wall,
                    "details": details,
                }
            )
            print({k: v for k, v in rows[-1].items() if k != "details"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--modes", nargs="+", default=["compact", "flexible", "none"], choices=["compact", "flexible", "none"]
    )
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--set", action="append", default=[], help="config overrides (e.g. graphs.enabled=off)")
    ap.add_argument("--out", default=str(OUT / "structured_quality.json"))
    a = ap.parse_args()
    rows = [r for mode in a.modes for r in run_mode(mode, a.max_tokens, a.set)]
    summary = []
    for mode in a.modes:
        mine = [r for r in rows if r["mode"] == mode]
        greedy = next(r for r in mine if r["run"] == "greedy")
        sampled = [r for r in mine if r["run"] != "greedy"]
        summary.append(
            {
                "mode": mode,
                "greedy ok": f"{greedy['ok']}/{greedy['tasks']}",
                "greedy share": greedy["ok_share"],
                "T0.7 share": sum(r["ok"] for r in sampled) / sum(r["tasks"] for r in sampled),
                "mean tokens": sum(r["mean_tokens"] for r in mine) / len(mine),
            }
        )
    write_json(
        a.out,
        {
            "rows": rows,
            "summary": summary,
            "max_tokens": a.max_tokens,
            "sets": a.set,
            "peak_rss_mib": peak_rss_mib(),
        },
    )
    print(
        f"peak RSS {peak_rss_mib():.0f} MiB; {len(tasks())} tasks, max_tokens {a.max_tokens}; JSON: {a.out}"
    )
    print(table(summary, ["mode", "greedy ok", "greedy share", "T0.7 share", "mean tokens"]))


if __name__ == "__main__":
    main()
