"""Speculative decoding changes no output: the engine with n-gram drafts gives the same tokens as
without, token for token (greedy, and seeded sampling: its draws are keyed by output position),
with the same texts, finish reasons and logprobs, on a mixed workload (stop strings, EOS,
max_tokens, min_tokens, n > 1, penalties, logprobs, an abort mid-stream, preemption, prefix-cache
hits), with and without overlapped steps; against transformers on tiny models; on the default
model; under a grammar. Every run leaves the KV pool whole (checked by the driver)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from drivers.workload import (
    EOS,
    WORKLOAD,
    Req,
    Run,
    check_deltas,
    drive,
    pending_at_launch,
    prompt,
    save_eos_model,
)
from rillet.core.config import RilletConfig, config_from_dict
from rillet.core.engine.core import EngineCore
from rillet.core.llm import LLM
from rillet.core.model.decoder import DecoderModel
from rillet.core.outputs import SeqDelta
from rillet.core.runner import model_runner
from rillet.core.runner.base import SampleResult
from rillet.core.runner.verify_rounds import NOT_COMPUTED, sample_in_rounds
from rillet.core.runtime import Runtime, load_runtime
from rillet.core.sampling_params import SamplingParams
from rillet.core.sampling_params import SamplingParams as P
from rillet.core.sequence import FinishReason
from rillet.core.spec.draft_model import DraftModelDrafter
from rillet.core.spec.ngram import NgramDrafter
from rillet.core.spec.setup import build_speculator
from rillet.core.spec.speculator import Speculator

# input-grounded requests: their outputs repeat what came before, so drafts get accepted
GROUNDED = [
    Req("echo", prompt(10, 12) * 3, P(max_tokens=30, temperature=0.0, ignore_eos=True)),
    Req("echo-seeded", prompt(11, 9) * 3, P(max_tokens=24, temperature=0.6, seed=7, logprobs=2), arrive=3),
    Req("echo-stop", prompt(12, 7) * 3, P(max_tokens=30, temperature=0.0, stop=("5*",)), arrive=5),
    # its first token lands in a step that verifies others' drafts: the prompt's logprobs with it
    Req("prompt-lps", prompt(13, 6) * 2, P(max_tokens=10, temperature=0.0, prompt_logprobs=2), arrive=4),
]


@pytest.fixture(scope="module")
def eos_model(tiny_hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    _, hf = tiny_hf_model("llama", num_hidden_layers=2)
    return save_eos_model(hf, tmp_path_factory.mktemp("hf_llama_eos_spec"))


@pytest.fixture(scope="module")
def runtime(eos_model: Path) -> Runtime:
    cfg = config_from_dict(
        {
            "model": {"path": str(eos_model), "kind": "hf", "dtype": "float32"},
            "cache": {"num_blocks": 22, "block_size": 8},
            "scheduler": {"max_num_seqs": 6, "max_num_batched_tokens": 32},
        }
    )
    return load_runtime(cfg)


class AdaptiveNgram(NgramDrafter):
    cheap = False  # its drafts sized as a draft model's: adaptive k (core/spec/adaptive.py)


def speculator(rt: Runtime, adaptive: bool = False, **over: Any) -> Speculator:
    # row_cost 0: every sequence of a batch of 8 drafts what it proposes (the bar is B x row_cost)
    spec = {"method": "ngram", "max_batch": 8, "row_cost": 0.0, **over}
    cfg = config_from_dict({"speculative": spec}).speculative
    drafter = (AdaptiveNgram if adaptive else NgramDrafter)(cfg.ngram_min, cfg.ngram_max)
    return Speculator(cfg, drafter, rt.max_model_len, (EOS,))


def same_outputs(a: Run, b: Run, workload: list[Req]) -> None:
    check_deltas(a, workload)
    check_deltas(b, workload)
    ta, tb = a.tokens(), b.tokens()
    aborted = {(r.rid, i) for r in workload if r.abort_after is not None for i in range(r.n)}
    for key in aborted:  # cut after a delta of several tokens: both are prefixes of one stream
        n = min(len(ta.pop(key)), len(tb.pop(key)))
        assert n >= 1 and a.tokens()[key][:n] == b.tokens()[key][:n]
    assert ta == tb
    assert a.finishes() == b.finishes()
    assert _stop_strs(a) == _stop_strs(b)
    assert _prompt_lps(a).keys() == _prompt_lps(b).keys()
    for key, lps in _prompt_lps(a).items():
        assert [t for t, _ in lps] == [t for t, _ in _prompt_lps(b)[key]]
        assert [x for _, x in lps] == pytest.approx([x for _, x in _prompt_lps(b)[key]], abs=1e-4)
    texts = {k: "".join(d.text for d in ds) for k, ds in a.deltas.items() if k not in aborted}
    assert texts == {k: "".join(d.text for d in ds) for k, ds in b.deltas.items() if k not in aborted}
    for key in ta:
        la = [lp for d in a.deltas[key] for lp in d.logprobs or []]
        lb = [lp for d in b.deltas[key] for lp in d.logprobs or []]
        assert [(x.token_id, [t for t, _ in x.top]) for x in la] == [
            (x.token_id, [t for t, _ in x.top]) for x in lb
        ]
        assert [x.logprob for x in la] == pytest.approx([x.logprob for x in lb], abs=1e-4)


def _stop_strs(run: Run) -> dict[tuple[str, int], str | None]:
    return {k: ds[-1].stop_str for k, ds in run.deltas.items()}


def _prompt_lps(run: Run) -> dict[tuple[str, int], list[tuple[int, float]]]:
    """Each choice's prompt logprobs, (token, logprob) by position, from the delta that carried them."""
    return {
        k: [(x.token_id, x.logprob) for x in d.prompt_logprobs]
        for k, ds in run.deltas.items()
        for d in ds
        if d.prompt_logprobs is not None
    }


@pytest.mark.parametrize(
    ("overlap", "depth", "max_batch", "rounds"),
    [(False, 1, 8, True), (True, 1, 8, False), (True, 2, 3, True)],
)
def test_the_workload_gives_the_same_outputs_with_speculation(
    runtime: Runtime, overlap: bool, depth: int, max_batch: int, rounds: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """depth: engine.overlap_depth. Steps that may speculate (at most `max_batch` running) land
    first; above it, steps keep `depth` in flight, and the engine moves between the two. rounds:
    the verify steps' head goes in rounds as torch's int8 kernel's does (this float32 model's head
    takes every row in one round)."""
    skipped: list[int] = []  # per verify step: rows past a refusal, whose logits were never computed
    if rounds:
        monkeypatch.setattr(DecoderModel, "head_per_row_block", lambda self, argmax_only=False: True)

    def spy(*args: Any) -> tuple[SampleResult, torch.Tensor]:
        result, tokens = sample_in_rounds(*args)
        skipped.append(result.token_ids.count(NOT_COMPUTED))
        return result, tokens

    workload = WORKLOAD + GROUNDED
    plain = drive(runtime, overlap=False, workload=workload)
    spec = speculator(runtime, max_batch=max_batch)
    monkeypatch.setattr(model_runner, "sample_in_rounds", spy)
    pending = pending_at_launch(runtime, monkeypatch)
    fast = drive(runtime, overlap=overlap, workload=workload, spec=spec, depth=depth)
    same_outputs(plain, fast, workload)
    # max_batch 8 covers every running sequence (max_num_seqs 6): every step may speculate and
    # lands before the next; with 3, the busier steps keep two in flight
    assert max(pending) == (2 if depth == 2 else 0)
    # the CPU verify steps went in rounds (verify_rounds.py), or in one
    assert skipped and (max(skipped) > 0) == rounds
    st = spec.stats
    assert st.accepted > 0 and st.drafted > st.accepted  # drafts were kept, and some refused
    assert fast.steps < plain.steps
    assert fast.preemptions > 0 and fast.prefix_hit_tokens > 0
    finishes = fast.finishes()
    assert finishes[("echo-stop", 0)] is FinishReason.STOP and finishes[("aborted", 0)] is FinishReason.ABORT
    assert _stop_strs(fast)[("echo-stop", 0)] == "5*" and ("prompt-lps", 0) in _prompt_lps(fast)
    assert any(fast.tokens()[k][-1] == EOS for k, f in finishes.items() if f is FinishReason.STOP)
    # several tokens of one sequence reached the front end as one delta; a first token came alone
    assert max(len(d.token_ids) for ds in fast.deltas.values() for d in ds) > 1
    assert all(len(ds[0].token_ids) == 1 for ds in fast.deltas.values())


def test_an_abort_while_its_drafts_are_verified_changes_no_other_output(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With overlapped steps the front end can abort a request while the step verifying its draft
    is in flight. The abort clears its draft_ids; the landing must still skip all of its rows (the
    bug found 2026-12-02: it skipped one, and every later sequence of the step took its
    neighbour's token). 1-token n-gram lookups sized by adaptive k (4 at most, the policy of the
    time) make "aborted" draft at that moment."""
    in_flight: list[bool] = []
    real_abort = EngineCore.abort

    def abort(core: EngineCore, request_id: str, *args: Any) -> list[SeqDelta]:
        ids = {s.seq_id for s in core.seqs.get(request_id, [])}
        in_flight.append(any(i in f.verifies for f in core._flights for i in ids))
        return real_abort(core, request_id, *args)

    workload = WORKLOAD + GROUNDED
    plain = drive(runtime, overlap=False, workload=workload)
    monkeypatch.setattr(EngineCore, "abort", abort)
    fast = drive(
        runtime,
        overlap=True,
        workload=workload,
        spec=speculator(runtime, ngram_min=1, num_tokens=4, adaptive=True),
    )
    assert in_flight == [True]  # the abort came while the step verifying its draft was in flight
    same_outputs(plain, fast, workload)


@pytest.mark.parametrize("draft", ["itself", "another"])
def test_a_draft_model_gives_the_same_outputs(
    runtime: Runtime, eos_model: Path, tiny_hf_model: Any, draft: str
) -> None:
    """The draft model drafts greedily with its own KV pool (rolled back with the target's): the
    model itself (its greedy drafts are right unless a seeded row draws otherwise), or another
    random model with the same tokenizer (mostly wrong)."""
    folder = eos_model if draft == "itself" else tiny_hf_model("llama", seed=1, num_hidden_layers=1)[0]
    cfg = config_from_dict(
        {
            "model": {"path": str(eos_model), "kind": "hf", "dtype": "float32"},
            "cache": {"num_blocks": 22, "block_size": 8},
            "speculative": {"method": "draft", "draft_model": str(folder), "max_batch": 8, "num_tokens": 3},
        }
    )
    rt = runtime
    spec = build_speculator(
        cfg, rt.runner.model, (EOS,), rt.max_model_len, torch.device("cpu"), torch.float32, 22, rt.tokenizer
    )
    assert spec is not None
    workload = WORKLOAD + GROUNDED
    plain = drive(rt, overlap=False, workload=workload)
    fast = drive(rt, overlap=False, workload=workload, spec=spec)
    same_outputs(plain, fast, workload)
    st = spec.stats
    assert st.accepted > 0
    if draft == "itself":
        assert st.accepted > st.drafted // 2
    drafter = spec.drafter
    assert isinstance(drafter, DraftModelDrafter)
    drafter.blocks.check_integrity()
    assert not drafter._shadow and drafter.blocks.num_used == 0  # every finished sequence let go
    spec.close()


def test_no_speculation_above_max_batch(runtime: Runtime) -> None:
    workload = [
        Req(f"r{i}", prompt(20 + i, 3) * 2, P(max_tokens=12, temperature=0.0, ignore_eos=True))
        for i in range(4)
    ]
    spec = speculator(runtime, max_batch=3)
    plain = drive(runtime, overlap=False, workload=workload)
    fast = drive(runtime, overlap=False, workload=workload, spec=spec)
    same_outputs(plain, fast, workload)
    assert spec.stats.drafted == 0  # all four admitted at the first step, all end at the last
    allowed = speculator(runtime, max_batch=4)
    same_outputs(plain, drive(runtime, overlap=False, workload=workload, spec=allowed), workload)
    assert allowed.stats.drafted > 0


def tiny_cfg(folder: Path, **sections: Any) -> RilletConfig:
    return config_from_dict({"model": {"path": str(folder), "kind": "hf", "dtype": "float32"}, **sections})


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [("llama", {"num_hidden_layers": 3}), ("qwen2", {"tie_word_embeddings": False})],
)
def test_tiny_models_match_transformers_with_speculation(
    tiny_hf_model: Any, model_type: str, overrides: dict[str, Any]
) -> None:
    folder, hf = tiny_hf_model(model_type, **overrides)
    prompts = [[(7 * i + 3 * k) % 250 + 1 for k in range(ln)] * 3 for i, ln in enumerate([3, 17, 9, 1])]
    new = [24, 16, 30, 20]
    want = []
    for p, n in zip(prompts, new, strict=True):
        with torch.inference_mode():
            g = hf.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
        want.append(g[0, len(p) :].tolist())
    spec = {"method": "ngram", "max_batch": 8, "num_tokens": 5, "row_cost": 0.0}
    for sections in (
        {},
        {"cache": {"num_blocks": 12, "block_size": 8}},
        {"scheduler": {"max_num_batched_tokens": 7, "max_num_seqs": 3}},
    ):
        with LLM(tiny_cfg(folder, speculative=spec, **sections)) as llm:
            outs = llm.generate(prompts, [P(max_tokens=n, temperature=0.0, ignore_eos=True) for n in new])
            assert [o.outputs[0].token_ids for o in outs] == want, sections
            core = llm.engine.core
            core.blocks.check_integrity()
            assert core.blocks.num_used == 0
            assert core.spec is not None and core.spec.stats.accepted > 0, sections


DEFAULT_PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef add(a, b):\n",
    '{"name": "Ada", "age": 36, "city": "London"}\n{"name": "Ada", "age": 36, "city": "London"}\n{"name":',
    "Rewrite this sentence: the cat sat on the mat because the mat was warm.\nRewritten: the cat",
]


def test_default_model_gives_the_same_tokens_with_speculation() -> None:
    base = {"model": {"dtype": "float32", "device": "cpu"}, "cache": {"num_blocks": 40, "block_size": 16}}
    params = [P(max_tokens=24, temperature=0.0), P(max_tokens=16, temperature=0.8, seed=3, logprobs=1)] * 3
    prompts = DEFAULT_PROMPTS + DEFAULT_PROMPTS[2:3]  # the repeat hits the prefix cache

    def run(spec: dict[str, Any]) -> tuple[list[tuple[list[int], str]], Any]:
        with LLM(config_from_dict({**base, "speculative": spec})) as llm:
            outs = llm.generate(prompts, params)
            core = llm.engine.core
            core.blocks.check_integrity()
            assert core.blocks.num_used == 0
            return [(o.outputs[0].token_ids, o.outputs[0].text) for o in outs], core.spec

    plain, _ = run({})
    fast, spec = run({"method": "ngram", "max_batch": 8, "row_cost": 0.0})
    assert fast == plain
    assert spec is not None and spec.stats.accepted >= 8


DOC = {
    "type": "array",
    "minItems": 4,
    "maxItems": 4,
    "items": {
        "type": "object",
        "properties": {
            "k": {"enum": ["alpha", "beta"]},
            "v": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["k", "v"],
    },
}


def test_structured_outputs_give_the_same_json_with_speculation() -> None:
    """Drafts are cut at the grammar's first refusal; each verified position is masked by the grammar
    state after the drafts before it; the matcher ends where the kept tokens leave it."""
    pytest.importorskip("llguidance")
    from rillet.core.structured.spec import GrammarSpec

    tiny = {"kind": "shape", "shape": "tiny", "device": "cpu", "dtype": "float32", "quantization": "none"}
    prompts = [f"Item list number {i}, please." for i in range(3)]
    params = [
        SamplingParams(
            max_tokens=90, temperature=t, seed=s, grammar=GrammarSpec("json_schema", json.dumps(DOC))
        )
        for t, s in ((0.0, None), (0.9, 4), (0.0, None))
    ]

    def run(spec: dict[str, Any]) -> tuple[list[str], Any]:
        # compact: a random-weight model would spend its 90 tokens on whitespace gaps otherwise
        sections = {
            "model": tiny,
            "graphs": {"compile_mode": "none"},
            "structured": {"whitespace": "compact"},
        }
        cfg = config_from_dict({**sections, "speculative": spec})
        with LLM(cfg) as llm:
            outs = llm.generate(prompts, params)
            llm.engine.core.blocks.check_integrity()
            return [o.outputs[0].text for o in outs], llm.engine.core.spec

    plain, _ = run({})
    fast, spec = run({"method": "ngram", "max_batch": 8, "ngram_min": 1, "row_cost": 0.0})
    assert fast == plain
    for text in fast:
        assert len(json.loads(text)) == 4  # random weights, yet valid: the grammar decides
    assert spec is not None and spec.stats.accepted > 0
