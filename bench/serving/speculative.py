"""Speculative decoding through the server: spec off vs n-gram vs a draft model, same run.

Each mode is a server of its own (started in turn, with its config overrides), asked the same
greedy chat requests at batch 1 and 8 (C concurrent clients), streamed and not, in ABBA order:
  (a) grounded: answers that repeat their input (rewrite, quote, code edit, JSON echo), where
      drafts taken from the prompt are often right; grounded-more: 8 more such prompts
      (`--prompt-sets` picks sets);
  (b) chat: open questions, where they rarely are (the target: no slower than without).
Modes (--modes): off and ngram serve the default config (int4 weights on CPU; off-torch-int4 and
ngram-torch-int4 the same through torch's int4 kernel instead of rillet's; off-gemm-attention and
ngram-gemm-attention with the steps' attention as GEMMs instead of rillet's kernel); the draft model
has nothing smaller to draft with here, so `draft` serves the default model in float32 with the
same GGUF drafting for it in int4, compared with `off-fp32` (the float32 target alone).
Reported per mode, set, batch and streaming: tok/s (completion tokens from `usage` / wall time),
its ratio to the mode's baseline (off, or off-fp32 for draft), the acceptance rate over the set
(from /metrics: accepted / drafted draft tokens) and tokens gained per verify step; the server's
peak RSS. Greedy outputs are the same in every mode (the tests prove it), so each mode generates
the same tokens. `--rounds R` starts every mode's server R times, the modes in turn (off, ngram,
off, ngram, ...): a drifting host then shifts both alike, where one start a mode puts the drift
between them; the rows add up every round's tokens and seconds, and `vs_baseline_rounds` lists
each round's own ratio (bench/lib/rounds.py).

    .venv/bin/python -m bench.serving.speculative                      # the full measurement
    .venv/bin/python -m bench.serving.speculative --modes off ngram --max-tokens 8 --runs 1 \\
        --concurrency 1                                                 # a smoke run
    .venv/bin/python -m bench.serving.speculative --modes off ngram --concurrency 1 --rounds 3
    .venv/bin/python -m bench.serving.speculative --external llama.cpp=http://127.0.0.1:8080/v1
    .venv/bin/python -m bench.serving.speculative --modes off ngram --server-cpus 0 --client-cpus 1 \
        --set model.num_threads=1                                       # server and client apart

`--external NAME=URL` adds an already running OpenAI-compatible server (e.g. llama.cpp's with its
own prompt-lookup or draft speculation, bench/README.md) as one more mode, measured the same way.
The prompt sets are in bench/lib/spec_prompts.py, the client's requests and the /metrics
counters in bench/lib/spec_client.py.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import openai

from bench.lib.common import add_pinning, peak_rss_mib, pin_client, table, write_json
from bench.lib.rounds import Row, merge, per_round
from bench.lib.server_proc import RilletServer
from bench.lib.spec_client import Batch, batch, spec_counters
from bench.lib.spec_prompts import SETS

TORCH_INT4 = {"RILLET_INT4_KERNEL": "aten"}  # int4 through torch's kernel (core/quant/rows_kernel.py)
GEMM_ATTENTION = {"RILLET_ATTENTION_KERNEL": "torch"}  # attention as GEMMs (core/attention/cpu_kernel.py)


def modes(gguf: str) -> dict[str, tuple[list[str], str | None, dict[str, str]]]:
    """name -> (server overrides, the baseline mode its speed is compared with, server env)."""
    fp32 = ["model.quantization=none", "model.dtype=float32"]
    draft = [
        "speculative.method=draft",
        f"speculative.draft_model={gguf}",
        "speculative.draft_quantization=int4",
    ]
    return {
        "off": ([], None, {}),
        "ngram": (["speculative.method=ngram"], "off", {}),
        "off-fp32": (fp32, None, {}),
        "draft": (fp32 + draft, "off-fp32", {}),
        # the same two with torch's int4 kernel instead of rillet's: before 2026-12-04
        "off-torch-int4": ([], "off", TORCH_INT4),
        "ngram-torch-int4": (["speculative.method=ngram"], "off-torch-int4", TORCH_INT4),
        # the same two with the decode and verify steps' attention as GEMMs: before 2026-12-05
        "off-gemm-attention": ([], "off", GEMM_ATTENTION),
        "ngram-gemm-attention": (["speculative.method=ngram"], "off-gemm-attention", GEMM_ATTENTION),
    }


def measure_mode(name: str, base_url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    model = openai.OpenAI(base_url=base_url, api_key="x").models.list().data[0].id
    rows = []
    for set_name in args.prompt_sets:
        prompts = SETS[set_name]
        for c in args.concurrency:
            clients = [
                openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=900) for _ in range(c)
            ]
            batch(clients, model, prompts, False, 2)  # warm-up (and the prompts' prefixes cached)
            d0, a0, v0 = spec_counters(base_url)
            runs: dict[bool, list[Batch]] = {False: [], True: []}
            for r in range(args.runs):  # ABBA
                for stream in (False, True) if r % 2 == 0 else (True, False):
                    runs[stream].append(batch(clients, model, prompts, stream, args.max_tokens))
            d1, a1, v1 = spec_counters(base_url)
            for stream, done in runs.items():
                # the counters cover both streaming modes' batches: each row gets half
                row = {"mode": name, "set": set_name, "batch": c, "stream": stream}
                row |= {"tokens": sum(b.tokens for b in done), "wall_s": sum(b.wall_s for b in done)}
                row |= {"drafted": (d1 - d0) / 2, "accepted": (a1 - a0) / 2, "verifies": (v1 - v0) / 2}
                rows.append(derive(row))
            print(f"{name} {set_name} batch {c}: done", file=sys.stderr)
    return rows


KEY = ("mode", "set", "batch", "stream")
SUMS = ("tokens", "wall_s", "drafted", "accepted", "verifies")


def derive(r: Row) -> Row:
    """Rates from a row's sums: tok/s, the acceptance of drafted tokens, tokens per verify step."""
    r["tok_s"] = r["tokens"] / r["wall_s"]
    r["acceptance"] = r["accepted"] / r["drafted"] if r["drafted"] else None
    r["tokens_per_verify"] = (r["accepted"] + r["verifies"]) / r["verifies"] if r["verifies"] else None
    return r


def ratios(rows: list[dict[str, Any]], baselines: dict[str, str | None]) -> None:
    index = {(r["mode"], r["set"], r["batch"], r["stream"]): r for r in rows}
    for r in rows:
        base = baselines.get(r["mode"])
        ref = index.get((base, r["set"], r["batch"], r["stream"])) if base else None
        r["vs_baseline"] = r["tok_s"] / ref["tok_s"] if ref else None
        plain = index.get((r["mode"], r["set"], r["batch"], False))
        r["stream_ratio"] = r["tok_s"] / plain["tok_s"] if r["stream"] and plain else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=["off", "ngram", "off-fp32", "draft"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--runs", type=int, default=2, help="batches per streaming mode (ABBA order)")
    ap.add_argument("--rounds", type=int, default=1, help="server starts per mode, modes in turn")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-sets", nargs="+", choices=list(SETS), default=list(SETS))
    ap.add_argument(
        "--set", dest="sets", action="append", default=[], help="override for every started server"
    )
    ap.add_argument("--external", action="append", default=[], help="NAME=URL of a running server (…/v1)")
    add_pinning(ap)
    ap.add_argument("--out", default="bench/out/speculative.json")
    args = ap.parse_args()
    server_cpus = pin_client(args)
    from rillet.core.loaders.default_model import default_model_path

    table_of = modes(str(default_model_path()))
    unknown = [m for m in args.modes if m not in table_of]
    if unknown:
        ap.error(f"unknown modes {unknown}; choose from {list(table_of)}")
    rss: dict[str, float | None] = {}
    baselines = {m: table_of[m][1] for m in args.modes}
    baselines |= {spec.split("=", 1)[0]: None for spec in args.external}
    rounds: list[list[Row]] = []
    for _ in range(args.rounds):
        got: list[Row] = []
        for name in args.modes:
            overrides, _, env = table_of[name]
            print(f"starting rillet serve ({name}) ...", file=sys.stderr)
            log_path = f"bench/out/speculative-{name}.log"
            with RilletServer(args.sets + overrides, log_path=log_path, cpus=server_cpus, env=env) as srv:
                got += measure_mode(name, srv.base_url, args)
                peak = srv.peak_rss_mib()
                rss[name] = max(peak, rss.get(name) or 0.0) if peak is not None else rss.get(name)
        for spec in args.external:
            name, url = spec.split("=", 1)
            got += measure_mode(name, url, args)
        ratios(got, baselines)
        rounds.append(got)
    rows = [derive(r) for r in merge(rounds, KEY, SUMS)]
    ratios(rows, baselines)
    per_round(rows, rounds, KEY, "vs_baseline")
    write_json(
        args.out,
        {"args": vars(args), "server_peak_rss_mib": rss, "client_peak_rss_mib": peak_rss_mib(), "rows": rows},
    )
    print(f"{args.max_tokens} tokens max per request, greedy chat; JSON: {args.out}")
    for name, mib in rss.items():
        print(
            f"server peak RSS ({name}): {mib:.0f} MiB" if mib is not None else f"server peak RSS ({name}): -"
        )
    cols = [
        "mode",
        "set",
        "batch",
        "stream",
        "tok_s",
        "vs_baseline",
        "vs_baseline_rounds",
        "stream_ratio",
        "acceptance",
        "tokens_per_verify",
    ]
    print(table([{k: _cell(v) for k, v in r.items()} for r in rows], cols))


def _cell(v: Any) -> Any:
    if isinstance(v, list):
        return " / ".join("-" if x is None else f"{x:.3f}" for x in v)
    return "-" if v is None else v


if __name__ == "__main__":
    main()
