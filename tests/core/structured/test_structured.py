"""Grammar compiling, caching, matchers and masks (core/structured/), and the engine keeping matcher
state right through preemption and prefix-cache resumes (random-weight tiny model: the grammar alone
decides validity, whatever the weights prefer)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from engine_hooks import hold_first_step
from rillet.core.config import config_from_dict
from rillet.core.engine.scheduler import Scheduler
from rillet.core.llm import LLM
from rillet.core.loaders.default_model import default_model_path
from rillet.core.runner.sampler import Sampler
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq
from rillet.core.structured.compiler import GrammarCompiler
from rillet.core.structured.json_style import json_options
from rillet.core.structured.masks import MaskFiller
from rillet.core.structured.matcher import GrammarViolation
from rillet.core.structured.schema import close_objects
from rillet.core.structured.spec import GrammarError, GrammarSpec
from rillet.core.tokenizer.tokenizer import Tokenizer

pytest.importorskip("llguidance")

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"}},
    "required": ["n", "ok"],
}
SPEC = GrammarSpec("json_schema", json.dumps(SCHEMA))


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf(default_model_path())


@pytest.fixture(scope="module")
def compiler(tok: Tokenizer) -> GrammarCompiler:
    # compact: after `{"n": ` only a digit may follow (flexible would allow more whitespace first)
    return GrammarCompiler(tok.backend_json(), 49152, tok.eos_token_ids, 4, json_options("compact"))


def test_compiled_grammars_are_cached_and_bounded(tok: Tokenizer) -> None:
    c = GrammarCompiler(tok.backend_json(), 49152, tok.eos_token_ids, cache_size=2)
    a, b = c.compile(SPEC), c.compile(GrammarSpec("json_schema", json.dumps(SCHEMA), param="other"))
    assert a is b and c.compiles == 1  # `param` is not part of the key
    for k in range(3):
        c.compile(GrammarSpec("json_schema", json.dumps({"enum": [k]})))
    assert c.cached == 2 and c.compiles == 4


@pytest.mark.parametrize(
    "schema",
    [{"type": "nope"}, {"$ref": "#/nowhere"}, {"type": "string", "pattern": "(("}, {"uniqueItems": True}],
)
def test_bad_schemas_raise_grammar_error_naming_the_field(compiler: GrammarCompiler, schema: Any) -> None:
    with pytest.raises(GrammarError) as err:
        compiler.compile(
            GrammarSpec("json_schema", json.dumps(schema), param="response_format.json_schema.schema")
        )
    assert err.value.param == "response_format.json_schema.schema"


def test_matcher_accepts_valid_tokens_and_refuses_others(compiler: GrammarCompiler, tok: Tokenizer) -> None:
    m = compiler.matcher(SPEC)
    ids = tok.encode('{"n": 3, "ok": true}', add_special_tokens=False)
    m.sync(ids[:2])
    assert m.consumed == 2
    m.sync(ids)  # catches up from where it was
    assert m.consumed == len(ids) and m.matcher.is_accepting()
    bad = compiler.matcher(SPEC)
    with pytest.raises(GrammarViolation):
        bad.accept(tok.encode("hello", add_special_tokens=False)[0])


def _seq(i: int, grammar: Any, output: list[int]) -> Seq:
    seq = Seq(i, f"r{i}", [1, 2, 3], SamplingParams(temperature=0.0))
    seq.grammar, seq.output_ids = grammar, list(output)
    return seq


@pytest.mark.parametrize("rows", [2, 6])  # inline fill, and the worker thread
def test_masks_touch_constrained_rows_only(compiler: GrammarCompiler, tok: Tokenizer, rows: int) -> None:
    filler = MaskFiller(49152, tok.eos_token_ids)
    prefix = tok.encode('{"n": ', add_special_tokens=False)
    seqs = [_seq(i, compiler.matcher(SPEC) if i % 2 == 0 else None, prefix) for i in range(rows)]
    logits = torch.randn(rows, 49152)
    pending = filler.begin(seqs)
    assert pending is not None and pending.rows == list(range(0, rows, 2))
    masked = pending.apply(logits)
    digits = {tok.encode(str(d), add_special_tokens=False)[0] for d in range(10)}
    for i in range(rows):
        allowed = set(torch.nonzero(masked[i] > float("-inf")).flatten().tolist())
        if i % 2 == 0:
            assert allowed and allowed <= digits  # the grammar state after `{"n": ` (synced from output_ids)
        else:
            assert torch.equal(masked[i], logits[i])
    sampled = Sampler(49152, tok.eos_token_ids, torch.device("cpu")).sample(logits, seqs, filler.begin(seqs))
    assert all(sampled.token_ids[i] in digits for i in range(0, rows, 2))
    filler.close()


@pytest.mark.parametrize("penalised", [False, True])
@pytest.mark.parametrize("rows", [3, 8])
def test_lazy_masks_give_the_tokens_of_full_masks(
    compiler: GrammarCompiler, tok: Tokenizer, rows: int, penalised: bool
) -> None:
    """Greedy rows: unmasked argmax kept when the grammar allows it, else the masked argmax; the
    tokens equal a full mask's, on logits whose argmax is allowed in some rows and not in others.
    Rows with logprobs stay on the full mask (their logprobs must be masked ones). `penalised`:
    the rows carry a repetition penalty and a logit bias (as constrained requests do by default,
    core/structured/defaults.py), which the lazy check sees: still lazy, still a full mask's tokens."""
    full, lazy = MaskFiller(49152, tok.eos_token_ids), MaskFiller(49152, tok.eos_token_ids, lazy=True)
    prefix = tok.encode('{"n": ', add_special_tokens=False)
    digit = tok.encode("7", add_special_tokens=False)[0]
    gen = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, 49152, generator=gen)
    logits[::2, digit] = 50.0  # even rows: the unmasked argmax is an allowed digit; odd: refused
    refused = int(logits[1].argmax())  # row 1's unmasked top token, which its grammar refuses
    sampler = Sampler(49152, tok.eos_token_ids, torch.device("cpu"))
    # the penalty lowers the prefix's tokens; the bias lifts row 1's refused top token further
    # (nothing changes which tokens are allowed) and a digit on every row
    extra: dict[str, Any] = (
        {"repetition_penalty": 1.5, "logit_bias": {refused: 5.0, digit + 1: 3.0}} if penalised else {}
    )

    def seqs(logprobs_row: int | None) -> list[Seq]:
        out = [_seq(i, compiler.matcher(SPEC) if i != 0 else None, prefix) for i in range(rows)]
        for s in out:
            s.params = SamplingParams(temperature=0.0, **extra)
        if logprobs_row is not None:
            out[logprobs_row].params = SamplingParams(temperature=0.0, logprobs=2, **extra)
        return out

    misses = 0
    for lp_row in (None, rows - 1):
        want = sampler.sample(logits, s := seqs(lp_row), full.begin(s)).token_ids
        pending = lazy.begin(s2 := seqs(lp_row))
        assert pending is not None
        lazy_rows = [i for i in range(1, rows) if i != lp_row]
        assert [i for i, _ in pending.lazy] == lazy_rows and pending.rows == ([lp_row] if lp_row else [])
        got = sampler.sample(logits, s2, pending).token_ids
        assert got == want
        misses += sum(i % 2 for i in lazy_rows)
    assert lazy.stats.lazy_misses == misses > 0 and lazy.stats.lazy_rows > misses
    full.close()
    lazy.close()


def test_close_objects() -> None:
    closed = close_objects(
        {"type": "object", "properties": {"a": {"properties": {}}}, "$defs": {"d": {"properties": {}}}}
    )
    assert (
        closed["additionalProperties"] is False and closed["properties"]["a"]["additionalProperties"] is False
    )
    assert closed["$defs"]["d"]["additionalProperties"] is False
    open_ = {"properties": {}, "additionalProperties": {"type": "integer"}}
    assert close_objects(open_) == open_
    assert "additionalProperties" not in close_objects({"allOf": [{"properties": {}}], "properties": {}})


# ---- the engine: preemption and prefix-cache resumes keep the matcher state -------------------------

TINY = {"kind": "shape", "shape": "tiny", "device": "cpu", "dtype": "float32", "quantization": "none"}
DOC = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 3,
            "maxItems": 6,
            "items": {
                "type": "object",
                "properties": {
                    "k": {"enum": ["a", "b"]},
                    "v": {"type": "integer", "minimum": 0, "maximum": 9},
                },
                "required": ["k", "v"],
            },
        }
    },
    "required": ["items"],
}


def _generate(
    cache: dict[str, Any],
    prompts: list[str],
    counter: list[int] | None = None,
    overlap: str = "off",
    lazy_masks: str = "auto",
    stats: list[Any] | None = None,
) -> list[str]:
    params = SamplingParams(
        max_tokens=120, temperature=0.0, grammar=GrammarSpec("json_schema", json.dumps(DOC))
    )
    sections = {
        "model": TINY,
        "cache": cache,
        "graphs": {"compile_mode": "none"},
        "engine": {"overlap": overlap},
        # compact: a random-weight model would spend its 120 tokens on whitespace gaps otherwise
        "structured": {"lazy_masks": lazy_masks, "whitespace": "compact"},
    }
    with LLM(config_from_dict(sections)) as llm:
        masks = llm.engine.runtime.runner.masks
        assert masks is not None and masks.lazy == (lazy_masks != "off")  # auto: on for CPU
        if counter is not None:
            # all prompts admitted together (first step held until they are in): the small pool
            # then preempts by block arithmetic, not because this machine added them fast enough
            hold_first_step(llm.engine, len(prompts))
            original = Scheduler._preempt

            def counting(self: Scheduler, seq: Seq) -> None:
                counter.append(seq.seq_id)
                original(self, seq)

            llm.engine.core.scheduler._preempt = counting.__get__(llm.engine.core.scheduler)  # type: ignore[method-assign]
        outs = llm.generate(prompts, params)
        if stats is not None:
            stats.append(masks.stats)
    return [o.outputs[0].text for o in outs]


def test_preempted_and_prefix_cached_sequences_keep_their_grammar_state() -> None:
    prompts = [f"Item list number {i}, please, with some words to fill a block or two." for i in range(6)]
    reference = _generate({"num_blocks": 256, "block_size": 16, "prefix_caching": False}, prompts)
    for text in reference:
        json.loads(text)  # random weights, yet valid: the grammar decides
    preempted: list[int] = []
    tight = _generate(
        {"num_blocks": 24, "block_size": 16, "prefix_caching": True}, prompts + prompts, preempted
    )
    assert preempted, "the small pool should have forced preemptions"
    assert tight == reference + reference  # the repeats resumed from the prefix cache


def test_overlapped_engine_runs_grammar_rows_exactly() -> None:
    # a constrained row needs its previous token on the host before its next mask (core/engine/overlap.py):
    # with engine.overlap on, the engine lands each step before scheduling such rows
    prompts = [f"Item list number {i}, please." for i in range(3)]
    cache = {"num_blocks": 256, "block_size": 16, "prefix_caching": False}
    assert _generate(cache, prompts, overlap="on") == _generate(cache, prompts, overlap="off")


def test_lazy_masks_keep_the_tokens_of_full_masks() -> None:
    # random weights: the unmasked argmax is almost always refused, so this runs the miss branch
    # on every row and step (the unit test above runs both branches)
    prompts = [f"Item list number {i}, please." for i in range(5)]
    cache = {"num_blocks": 256, "block_size": 16, "prefix_caching": False}
    stats: list[Any] = []
    lazy = _generate(cache, prompts, lazy_masks="on", stats=stats)
    assert lazy == _generate(cache, prompts, lazy_masks="off")
    assert stats[0].lazy_misses > 0 and stats[0].rows == 0  # every row lazy, none filled up front
