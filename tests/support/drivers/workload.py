"""A mixed engine workload driven step by step through `EngineCore`, recording every delta
(`from drivers.workload import ...`): the overlap and speculative-decoding tests run it in two
modes and compare.

The workload: greedy and seeded, n > 1, stop strings, EOS, max_tokens, min_tokens, logprobs, a
penalised request (synchronous steps under overlap), an abort mid-stream, staggered arrivals and
shared prompt prefixes (prefix-cache hits), meant for a random tiny Llama whose LM-head row for
EOS copies a frequent token's (so EOS is really generated) and a pool small enough to preempt.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from rillet.core.engine.core import EngineCore
from rillet.core.outputs import SeqDelta
from rillet.core.runtime import Runtime
from rillet.core.sampling_params import SamplingParams as P
from rillet.core.sequence import FinishReason, Seq
from rillet.core.spec.speculator import Speculator

EOS = 2  # the default tokenizer's <|im_end|>: the tiny model's folder has no tokenizer of its own
FREQUENT = 160  # a token the tiny model's greedy decode often picks


@dataclass
class Req:
    rid: str
    prompt: list[int]
    params: P
    n: int = 1
    arrive: int = 0  # engine step before which it is added
    abort_after: int | None = None  # aborted once choice 0 has delivered this many tokens


def save_eos_model(hf: Any, folder: Path) -> Path:
    """Saves `hf` (a tiny transformers Llama) with EOS's LM-head row a scaled copy of FREQUENT's,
    so that greedy decoding really generates EOS; `hf` itself is left as it was."""
    with torch.no_grad():
        head = hf.lm_head.weight.clone()
        hf.lm_head.weight[EOS] = 1.05 * head[FREQUENT]
        hf.save_pretrained(folder)
        hf.lm_head.weight.copy_(head)  # the fixture's model is shared with other tests
    return folder


SHARED = [(11 * k) % 240 + 3 for k in range(20)]  # a 20-token prefix several prompts start with


def prompt(i: int, length: int, shared: bool = False) -> list[int]:
    own = [(7 * i + 3 * k) % 250 + 3 for k in range(length)]
    return SHARED + own if shared else own


WORKLOAD = [
    Req("greedy-long", prompt(0, 30), P(max_tokens=40, temperature=0.0, ignore_eos=True)),
    Req("greedy-eos", prompt(1, 3), P(max_tokens=40, temperature=0.0)),
    Req("seeded-n3", prompt(2, 5, shared=True), P(max_tokens=24, temperature=1.0, seed=11), n=3),
    Req("stop-string", prompt(3, 9), P(max_tokens=40, temperature=0.0, stop=("24", "-J"))),
    Req("logprobs", prompt(4, 12, True), P(max_tokens=12, temperature=0.7, seed=5, logprobs=3), arrive=2),
    Req("penalised", prompt(5, 7), P(max_tokens=16, temperature=0.0, repetition_penalty=1.5), arrive=4),
    Req("min-tokens", prompt(6, 4), P(max_tokens=20, min_tokens=15, temperature=1.0, seed=3), arrive=6),
    Req("aborted", prompt(7, 10), P(max_tokens=40, temperature=0.0, ignore_eos=True), abort_after=5),
    Req("late-shared", prompt(8, 2, shared=True), P(max_tokens=18, temperature=0.0, stop=("h",)), arrive=20),
    Req("greedy-n2", prompt(9, 6), P(max_tokens=30, temperature=0.0), n=2, arrive=9),
]


@dataclass
class Run:
    deltas: dict[tuple[str, int], list[SeqDelta]]
    preemptions: int
    prefix_hit_tokens: int
    steps: int

    def tokens(self) -> dict[tuple[str, int], list[int]]:
        return {k: [t for d in ds for t in d.token_ids] for k, ds in self.deltas.items()}

    def finishes(self) -> dict[tuple[str, int], FinishReason | None]:
        return {k: ds[-1].finish_reason for k, ds in self.deltas.items()}


def make_seqs(req: Req, ids: itertools.count[int]) -> list[Seq]:
    seqs: list[Seq] = []
    for i in range(req.n):
        p = req.params
        if i and p.seed is not None:
            p = P(**{**p.__dict__, "seed": p.seed + i})
        seq = Seq(next(ids), req.rid, list(req.prompt), p, index=i)
        seq.leader = seqs[0] if seqs else None
        if p.prompt_logprobs is not None and i == 0:  # as Admission.make_seqs
            seq.prompt_lps = []
        seqs.append(seq)
    return seqs


def pending_at_launch(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Filled as the runner launches: per launch, the most tokens a sequence of it had in flight
    (engine.overlap: decodes fed from the future buffer with that many tokens unseen)."""
    pending: list[int] = []
    real_launch = rt.runner.launch

    def launch(batch: Any) -> Any:
        pending.append(max(s.num_pending for s in batch.seqs))
        return real_launch(batch)

    monkeypatch.setattr(rt.runner, "launch", launch)
    return pending


def drive(
    rt: Runtime, overlap: bool, workload: list[Req], spec: Speculator | None = None, depth: int = 1
) -> Run:
    """Runs the workload the way Engine._run does (one thread), recording every delta in order;
    `depth`: the steps in flight with overlap on (engine.overlap_depth)."""
    rt.scheduler.blocks.reset_prefix_cache()
    hits0 = rt.scheduler.blocks.stats.hit_tokens
    core = EngineCore(
        rt.scheduler, rt.runner, rt.make_detokenizer, rt.max_model_len, overlap, spec, overlap_depth=depth
    )
    preempted: list[int] = []
    real_preempt = rt.scheduler._preempt

    def spy(seq: Seq) -> None:
        preempted.append(seq.seq_id)
        real_preempt(seq)

    rt.scheduler._preempt = spy  # type: ignore[method-assign]
    deltas: dict[tuple[str, int], list[SeqDelta]] = {}
    ids = itertools.count()
    todo = sorted(workload, key=lambda r: r.arrive)
    aborted: set[str] = set()

    def record(new: list[SeqDelta]) -> None:
        for d in new:
            seen = deltas.setdefault((d.request_id, d.index), [])
            assert not seen or seen[-1].finish_reason is None, f"{d.request_id}: a delta after its finish"
            seen.append(d)

    try:
        step = 0
        while todo or core.has_work():
            while todo and todo[0].arrive <= step:
                core.add(make_seqs(todo.pop(0), ids))
            out = core.step()
            step += 1
            assert step < 2000, "the engine stalled"
            record(out.deltas if out else [])
            for req in workload:
                got = deltas.get((req.rid, 0), [])
                delivered = sum(len(d.token_ids) for d in got)
                if req.abort_after is not None and req.rid not in aborted and delivered >= req.abort_after:
                    aborted.add(req.rid)
                    record(core.abort(req.rid))
    finally:
        rt.scheduler._preempt = real_preempt  # type: ignore[method-assign]
    blocks = rt.scheduler.blocks
    blocks.check_integrity()
    assert blocks.num_used == 0, "KV blocks leaked"
    assert rt.runner.inputs.num_rows == 0  # type: ignore[attr-defined]
    assert not rt.runner.sampler._seeded  # type: ignore[attr-defined]
    return Run(deltas, len(preempted), blocks.stats.hit_tokens - hits0, core.steps)


def check_deltas(run: Run, workload: list[Req]) -> None:
    """Every choice ended once; its counts add up; nothing followed its finish (checked in drive)."""
    for req in workload:
        for i in range(req.n):
            ds = run.deltas[(req.rid, i)]
            assert ds[-1].finish_reason is not None
            assert ds[-1].completion_tokens == sum(len(d.token_ids) for d in ds)
            assert ds[-1].completion_tokens <= req.params.max_tokens
