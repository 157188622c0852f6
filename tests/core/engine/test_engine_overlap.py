"""engine.overlap: the pipelined step gives the same tokens as the synchronous one, token for token.

A mixed workload (greedy and seeded, n > 1, stop strings, EOS, max_tokens, min_tokens, logprobs,
a penalised request that forces synchronous steps, an abort mid-stream, staggered arrivals) runs on
a random tiny Llama with a pool small enough to preempt and shared prompt prefixes, driven step by
step through `EngineCore` with overlap off and on. The model's LM-head row for the EOS id copies
a frequent token's row (scaled up), so EOS is really generated.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from rillet.core.config import config_from_dict
from rillet.core.engine.core import EngineCore
from rillet.core.outputs import SeqDelta
from rillet.core.runtime import Runtime, load_runtime
from rillet.core.sampling_params import SamplingParams as P
from rillet.core.sequence import FinishReason, Seq

EOS = 2  # the default tokenizer's <|im_end|>: the tiny model's folder has no tokenizer of its own
FREQUENT = 160  # a token the tiny model's greedy decode often picks


@pytest.fixture(scope="module")
def eos_model(tiny_hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    _, hf = tiny_hf_model("llama", num_hidden_layers=2)
    folder = tmp_path_factory.mktemp("hf_llama_eos")
    with torch.no_grad():
        head = hf.lm_head.weight.clone()
        hf.lm_head.weight[EOS] = 1.05 * head[FREQUENT]
        hf.save_pretrained(folder)
        hf.lm_head.weight.copy_(head)  # the fixture's model is shared with other tests
    return folder


@pytest.fixture(scope="module")
def runtime(eos_model: Path) -> Runtime:
    cfg = config_from_dict(
        {
            "model": {"path": str(eos_model), "kind": "hf", "dtype": "float32"},
            "cache": {"num_blocks": 22, "block_size": 8},
            "scheduler": {"max_num_seqs": 6, "max_num_batched_tokens": 24},
        }
    )
    return load_runtime(cfg)


@dataclass
class Req:
    rid: str
    prompt: list[int]
    params: P
    n: int = 1
    arrive: int = 0  # engine step before which it is added
    abort_after: int | None = None  # aborted once choice 0 has delivered this many tokens


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
        seqs.append(seq)
    return seqs


def drive(rt: Runtime, overlap: bool, workload: list[Req]) -> Run:
    """Runs the workload the way Engine._run does (one thread), recording every delta in order."""
    rt.scheduler.blocks.reset_prefix_cache()
    hits0 = rt.scheduler.blocks.stats.hit_tokens
    core = EngineCore(rt.scheduler, rt.runner, rt.make_detokenizer, rt.max_model_len, overlap=overlap)
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


def test_overlap_on_and_off_give_the_same_tokens(runtime: Runtime) -> None:
    off = drive(runtime, overlap=False, workload=WORKLOAD)
    on = drive(runtime, overlap=True, workload=WORKLOAD)
    check_deltas(off, WORKLOAD)
    check_deltas(on, WORKLOAD)
    assert on.tokens() == off.tokens()
    assert on.finishes() == off.finishes()
    texts = {k: "".join(d.text for d in ds) for k, ds in on.deltas.items()}
    assert texts == {k: "".join(d.text for d in ds) for k, ds in off.deltas.items()}
    # logprobs: the same entries; values to float32 rounding (batches are composed differently)
    lp_on = [lp for d in on.deltas[("logprobs", 0)] for lp in d.logprobs or []]
    lp_off = [lp for d in off.deltas[("logprobs", 0)] for lp in d.logprobs or []]
    assert [(x.token_id, [t for t, _ in x.top]) for x in lp_on] == [
        (x.token_id, [t for t, _ in x.top]) for x in lp_off
    ]
    assert [x.logprob for x in lp_on] == pytest.approx([x.logprob for x in lp_off], abs=1e-4)

    # the workload exercised what it is meant to, in both modes
    tokens, finishes = on.tokens(), on.finishes()
    stops = [k for k, f in finishes.items() if f is FinishReason.STOP]
    assert any(tokens[k][-1] == EOS for k in stops), "no choice ended with EOS"
    assert any(tokens[k][-1] != EOS for k in stops), "no choice ended with a stop string"
    assert finishes[("greedy-long", 0)] is FinishReason.LENGTH
    assert finishes[("aborted", 0)] is FinishReason.ABORT and len(tokens[("aborted", 0)]) == 5
    assert len(tokens[("min-tokens", 0)]) >= 15
    assert len({tuple(tokens[("seeded-n3", i)]) for i in range(3)}) == 3  # seeds 11, 12, 13
    for run in (off, on):
        assert run.preemptions > 0, "the pool was meant to be too small for the whole workload"
        assert run.prefix_hit_tokens > 0, "shared prefixes were meant to hit the prefix cache"


def test_a_sequence_stopped_at_step_n_never_shows_its_token_from_n_plus_1(runtime: Runtime) -> None:
    """With overlap, the step after an EOS or a stop string is already launched when the host sees
    the stop: its token is dropped, never sent."""
    reqs = [Req("eos", prompt(9, 6), P(max_tokens=40, temperature=0.0, stop=("oo",)))]
    launched: list[int] = []
    runner = runtime.runner
    real_launch = runner.launch

    def counting_launch(batch: Any) -> Any:
        launched.extend(s.seq_id for s in batch.seqs)
        return real_launch(batch)

    runner.launch = counting_launch  # type: ignore[method-assign]
    try:
        on = drive(runtime, overlap=True, workload=reqs)
    finally:
        runner.launch = real_launch  # type: ignore[method-assign]
    tokens = on.tokens()[("eos", 0)]
    assert on.finishes()[("eos", 0)] is FinishReason.STOP
    # prefill + one launch per token after the first, + the one extra launch that was discarded
    assert len(launched) == len(tokens) + 1
