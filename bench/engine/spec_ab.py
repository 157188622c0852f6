"""Speculative-decoding settings compared in one engine: n-gram sizes, k, the draft length policy,
the verify step's LM head in rounds, spec off, at batch 1 / 2 / 4, without the HTTP stack.

Separate servers (bench.serving.speculative) differ by a few % between starts on a drifting host;
here every variant runs in one process, on the same compiled graphs, round-robin, so the
differences between variants are measured on the same machine state. The engine starts with
`speculative.method=ngram`, `num_tokens` = the largest k asked and `max_batch` = the largest batch
(the verify graph's buffers are sized for them); a variant then swaps the speculator's config and
n-gram drafter between batches (each request builds its draft length policy and n-gram index when
it starts, from them), and `verify_rounds.ROUND` (a verify step's head rounds, where it goes in
rounds: torch's int8 kernel; "rounds" variants put the candidate pass of greedy rows in rounds too,
as before 2026-12-05; "logits" ones take plain greedy rows' tokens as the argmax of [rows, vocab]
logits, not DecoderModel.greedy_tokens, as before 2026-12-05). "off" is a drafter that never
proposes (every step a plain decode);
"adaptive" variants size the lookup's drafts as a draft model's are (adaptive k, the policy
before 2026-12-03), "match" ones by the matched suffix and `row_cost`, "rate" ones by the matched
suffix at the most tokens per unit of step time (tried on 2026-12-05, not taken); "full-head" ones
give plain greedy rows the full int8 LM head instead of its candidate pass
(core/quant/candidate_head.py), as before 2026-12-03's second session; "int8-pass" ones pick few
rows' candidates through oneDNN's int8 pass, not the head's int4 copy
(core/quant/int4_candidates.py), as before 2026-12-05 12:00; "flat-prior" ones
estimate a match length's acceptance over the flat Beta(1, 1) prior instead of the prior by match
length (core/spec/draft_length.py), as before 2026-12-03 10:00.
Prompts: the server bench's grounded and chat sets (`--prompts`: any of its sets), through the
model's chat template, greedy, 128 tokens max; at batch B they go B at a time. Reports per
variant the best and median wall time of a set and tok/s, how many prompts' greedy tokens equal
spec off's (the same engine: a verify step's rows and a plain step's round alike only where both
take one saved step, README "Speculative decoding"), and the engine's peak RSS.

    .venv/bin/python -m bench.engine.spec_ab                              # batch 1, the variants below
    .venv/bin/python -m bench.engine.spec_ab --batch 2 4 --variants off adaptive-k4 match-k8
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections import defaultdict
from functools import partial
from typing import Any

from rillet.core.llm import LLM
from rillet.core.runner import verify_rounds
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq
from rillet.core.spec import draft_length, speculator
from rillet.core.spec.drafter import Draft
from rillet.core.spec.ngram import NgramDrafter

from bench.lib.common import decode_path, peak_rss_mib, table, write_json
from bench.lib.spec_prompts import SETS


@dataclasses.dataclass(frozen=True)
class Variant:
    k: int  # 0: off
    ngram_min: int = 1
    # match: ByMatch (row_cost) | rate: the most tokens per step time (_Rate) | adaptive: AdaptiveK
    policy: str = "match"
    row_cost: float = 0.1
    verify_cost: float = 0.11  # rate only
    rows: int = verify_rounds.ROUND  # LM head rows per round
    full_head: bool = False  # plain greedy rows through the full int8 head, not its candidate pass
    flat_prior: bool = False  # ByMatch's prior q = 1/2 for every match length (before 2026-12-03 10:00)
    rounds: bool = False  # a verify step's head in rounds of `rows` whatever the head (before 12-05)
    logits: bool = False  # plain greedy rows' tokens as the argmax of [rows, vocab] logits (before 12-05)
    int8_pass: bool = False  # few greedy rows' candidates through oneDNN, not the int4 copy (before 12-05)


VARIANTS: dict[str, Variant] = {
    "off": Variant(0),
    "adaptive-k4": Variant(4, policy="adaptive"),
    "adaptive-k8": Variant(8, policy="adaptive"),
    "min2-adaptive-k4": Variant(4, ngram_min=2, policy="adaptive"),
    "match-k8": Variant(8),
    "match-k6": Variant(6),
    "match-k4": Variant(4),
    "match-k8-c0.05": Variant(8, row_cost=0.05),
    "match-k8-c0.15": Variant(8, row_cost=0.15),
    "match-k8-c0.2": Variant(8, row_cost=0.2),  # speculative.row_cost's CPU default (2026-12-03)
    "match-k7-c0.2": Variant(7, row_cost=0.2),  # 8 query rows: the AMX Xeon's verify cost jumps at 9
    "match-k8-c0.3": Variant(8, row_cost=0.3),
    "match-k8-c0.4": Variant(8, row_cost=0.4),
    "match-k8-c0.5": Variant(8, row_cost=0.5),
    "match-k8-c0.6": Variant(8, row_cost=0.6),
    "match-k8-one-round": Variant(8, rows=1_000),
    "match-k8-c0.2-rounds": Variant(8, row_cost=0.2, rounds=True),  # before 2026-12-05 09:30
    "off-logits": Variant(0, logits=True),
    "match-k8-c0.2-logits": Variant(8, row_cost=0.2, logits=True),
    "off-int8-pass": Variant(0, int8_pass=True),
    "match-k8-c0.2-int8-pass": Variant(8, row_cost=0.2, int8_pass=True),
    "rate-k8": Variant(8, policy="rate", row_cost=0.05),  # the costs measured on 2026-12-05
    "rate-k8-v0.2": Variant(8, policy="rate", row_cost=0.05, verify_cost=0.2),
    "off-full-head": Variant(0, full_head=True),
    "match-k8-full-head": Variant(8, full_head=True),
    "match-k8-flat-prior": Variant(8, flat_prior=True),
    "match-k12": Variant(12),
    "match-k16": Variant(16),
}


def _flat_prior(match: int) -> float:
    return 0.5


PRIOR_Q = draft_length.prior_q
BY_MATCH = speculator.ByMatch


class _NoDrafts(NgramDrafter):
    def propose(self, seqs: list[Seq], ks: list[int], hidden: Any = None) -> list[Draft]:
        return [Draft([]) for _ in seqs]


class _AdaptiveNgram(NgramDrafter):
    cheap = False  # the speculator then sizes its drafts with adaptive k, as a draft model's


class _Rate(draft_length.ByMatch):
    """ByMatch with the draft length that makes the most tokens per unit of step time, tried on
    2026-12-05 and not taken (bench/RESULTS.md): k maximizes (1 + q + ... + q^k) / (1 + B (verify
    + k row_cost)), k = 0 giving 1, instead of keeping the j-th token while q^j >= B row_cost."""

    __slots__ = ("verify_cost",)

    def __init__(self, k_max: int, row_cost: float, verify_cost: float) -> None:
        super().__init__(k_max, row_cost)
        self.verify_cost = verify_cost

    def keep(self, draft: Draft, batch: int = 1) -> int:
        accepted, refused = self.stats.get(draft.match, (0.0, 0.0))
        weight = draft_length.PRIOR_WEIGHT
        q = (accepted + weight * draft_length.prior_q(draft.match)) / (accepted + refused + weight)
        k, best, tokens, reach = 0, 1.0, 1.0, 1.0
        for j in range(1, len(draft.tokens) + 1):
            reach *= q
            tokens += reach
            rate = tokens / (1.0 + batch * (self.verify_cost + j * self.row_cost))
            if rate > best:
                k, best = j, rate
        if k == 0 and draft.tokens:
            decay = draft_length.SKIP_DECAY
            self.stats[draft.match] = (accepted * decay, refused * decay)
        self._match = draft.match
        return k


def _use(llm: LLM, v: Variant, base: Any, candidates: Any, int4_pass: Any) -> None:
    head = llm.engine.core.runner.model.quant_head  # type: ignore[attr-defined]
    if head is not None:
        head.candidate_head = None if v.full_head else candidates
        head.int4_candidates = None if v.full_head or v.int8_pass else int4_pass
    spec = llm.engine.core.spec
    assert spec is not None
    spec.cfg = dataclasses.replace(
        base, ngram_min=v.ngram_min, num_tokens=v.k or base.num_tokens, row_cost=v.row_cost
    )
    spec.row_cost = v.row_cost
    by_match = partial(_Rate, verify_cost=v.verify_cost) if v.policy == "rate" else BY_MATCH
    speculator.ByMatch = by_match  # type: ignore[assignment]
    kind = _NoDrafts if v.k == 0 else _AdaptiveNgram if v.policy == "adaptive" else NgramDrafter
    spec.drafter = kind(v.ngram_min, base.ngram_max)
    verify_rounds.ROUND = v.rows
    model = llm.engine.core.runner.model  # type: ignore[attr-defined]
    if v.logits and model.quant_head is not None:  # the argmax of the candidates' [rows, vocab] logits
        model.greedy_tokens = lambda h: model.quant_head.candidate_logits(h).argmax(-1)
    else:
        model.__dict__.pop("greedy_tokens", None)
    if v.rounds:
        model.head_per_row_block = lambda argmax_only=False: True
    else:
        model.__dict__.pop("head_per_row_block", None)
    draft_length.prior_q = _flat_prior if v.flat_prior else PRIOR_Q


def _ratio(off: list[float] | None, ws: list[float]) -> float | None:
    return None if not off else round(statistics.median(off[1:]) / statistics.median(ws), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--variants", nargs="+", default=["off", "adaptive-k4", "match-k8"], choices=list(VARIANTS)
    )
    ap.add_argument("--batch", nargs="+", type=int, default=[1])
    ap.add_argument("--prompts", dest="sets_run", nargs="+", default=["grounded", "chat"], choices=list(SETS))
    ap.add_argument("--rounds", type=int, default=5, help="passes over the variants")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="config override k=v")
    ap.add_argument("--out", default="bench/results/spec_ab.json")
    args = ap.parse_args()
    k_max = max(VARIANTS[v].k for v in args.variants) or 4
    # the verify graph holds max_batch rows: a larger batch would verify eager
    over = [
        "speculative.method=ngram",
        f"speculative.num_tokens={k_max}",
        f"speculative.max_batch={max(args.batch)}",
        *args.sets,
    ]
    sets = {name: SETS[name] for name in args.sets_run}
    walls: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    tokens: dict[tuple[str, int, str], int] = {}
    answers: dict[tuple[str, int, str], list[list[int]]] = {}  # each prompt's greedy tokens (last pass)
    with LLM(overrides=over) as llm:
        tok = llm.tokenizer

        def chat(p: str) -> str:
            return tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)

        decode_path(llm)  # waits for the background compile (the verify step's too)
        base = llm.engine.core.spec.cfg  # type: ignore[union-attr]
        head = llm.engine.core.runner.model.quant_head  # type: ignore[attr-defined]
        candidates = None if head is None else head.candidate_head
        int4_pass = None if head is None else head.int4_candidates
        sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
        for _ in range(args.rounds + 1):  # the first pass warms the prefix cache, not counted
            for b in args.batch:
                for name in args.variants:
                    _use(llm, VARIANTS[name], base, candidates, int4_pass)
                    for set_name, prompts in sets.items():
                        t0 = time.perf_counter()
                        got: list[list[int]] = []
                        for i in range(0, len(prompts), b):
                            outs = llm.generate([chat(p) for p in prompts[i : i + b]], sp)
                            got.extend(list(o.outputs[0].token_ids) for o in outs)
                        walls[(set_name, b, name)].append(time.perf_counter() - t0)
                        tokens[(set_name, b, name)] = sum(map(len, got))
                        answers[(set_name, b, name)] = got
    rows: list[dict[str, Any]] = []
    for (set_name, b, name), ws in sorted(walls.items()):
        ws = ws[1:]
        off = walls.get((set_name, b, "off"))
        best = min(ws)
        plain = answers.get((set_name, b, "off"))
        mine = answers[(set_name, b, name)]
        equal = None if plain is None else sum(a == p for a, p in zip(mine, plain, strict=True))
        same = None if equal is None else f"{equal}/{len(mine)}"
        rows.append(
            {
                "set": set_name,
                "batch": b,
                "variant": name,
                "best_ms": round(best * 1e3),
                "median_ms": round(statistics.median(ws) * 1e3),
                "tok_s": round(tokens[(set_name, b, name)] / best, 1),
                "vs_off_median": _ratio(off, ws),
                "same_as_off": same,  # prompts whose greedy tokens equal spec off's
            }
        )
    rss = peak_rss_mib()
    print(f"greedy, {args.max_tokens} tokens max, best / median of {args.rounds} passes")
    print(f"peak RSS {rss:.0f} MiB")
    cols = ["set", "batch", "variant", "best_ms", "median_ms", "tok_s", "vs_off_median", "same_as_off"]
    print(table(rows, cols))
    write_json(args.out, {"args": vars(args), "rows": rows, "peak_rss_mib": peak_rss_mib()})


if __name__ == "__main__":
    main()
