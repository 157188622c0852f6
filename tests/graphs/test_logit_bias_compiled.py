"""logit_bias with the compiled decode step (the tiny shape model, torch.compile'd on CPU): -100 on
the greedy answer's first token changes it, +100 on a token forces every token, and under a grammar
the bias moves the choice among the tokens the grammar allows and never past its mask. The step
only produces hidden states; the bias is added by the sampler outside the graph."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.runner.model_runner import ModelRunner
from rillet.core.sampling_params import SamplingParams
from rillet.core.structured.spec import GrammarSpec
from rillet.graphs.interface import DecodeBatch

pytestmark = pytest.mark.compiled

TINY = {"kind": "shape", "shape": "tiny", "device": "cpu", "dtype": "float32", "quantization": "none"}
PROMPTS = ["The weather today is", "Once upon a time"]


@pytest.fixture(scope="module")
def compiled() -> Iterator[tuple[LLM, list[int]]]:
    cfg = config_from_dict(
        {"model": TINY, "graphs": {"enabled": "on", "buckets": [1, 2, 4]}, "cache": {"num_blocks": 64}}
    )
    llm = LLM(cfg)
    try:
        runner = llm.engine.core.runner
        assert isinstance(runner, ModelRunner) and runner.graph_runner is not None
        gr = runner.graph_runner.compiled
        assert gr is not None and gr.wait(timeout=900) and gr.failed is None and gr.ready
        rows: list[int] = []
        fn = gr.fn

        def spy(batch: DecodeBatch) -> torch.Tensor:
            rows.append(batch.num_rows)
            return fn(batch)

        gr.fn = spy
        yield llm, rows
    finally:
        llm.close()


def _tokens(llm: LLM, **params: Any) -> list[list[int]]:
    p = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, **params)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, [p] * len(PROMPTS))]


def test_logit_bias_bans_and_forces_with_the_compiled_step(compiled: tuple[LLM, list[int]]) -> None:
    llm, rows = compiled
    base = _tokens(llm)
    assert rows, "the decode steps ran the compiled step"
    for prompt, greedy in zip(PROMPTS, base, strict=True):
        p = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logit_bias={greedy[0]: -100})
        assert llm.generate([prompt], [p])[0].outputs[0].token_ids[0] != greedy[0]
    unused = next(t for t in range(100, 1000) if all(t not in b for b in base))
    rows.clear()
    assert _tokens(llm, logit_bias={unused: 100}) == [[unused] * 6] * len(PROMPTS)
    assert rows and max(rows) == len(PROMPTS)  # batched compiled decode steps, both rows biased
    llm.engine.core.blocks.check_integrity()


def test_logit_bias_under_a_grammar(compiled: tuple[LLM, list[int]]) -> None:
    """A digit 0..9: one token each in this tokenizer, and no other spelling of it."""
    llm, _ = compiled
    tok = llm.engine.tokenizer
    digit = {d: tok.encode(str(d), add_special_tokens=False) for d in range(10)}
    assert all(len(ids) == 1 for ids in digit.values())
    grammar = GrammarSpec("json_schema", json.dumps({"type": "integer", "minimum": 0, "maximum": 9}))

    def answer(**bias: Any) -> int:
        p = SamplingParams(max_tokens=4, temperature=0.0, grammar=grammar, **bias)
        return int(json.loads(llm.generate(PROMPTS[:1], [p])[0].outputs[0].text))

    greedy = answer()
    assert answer(logit_bias={digit[greedy][0]: -100}) != greedy
    target = 7 if greedy != 7 else 3
    assert answer(logit_bias={digit[target][0]: 100}) == target
    letter = tok.encode("a", add_special_tokens=False)[0]
    assert answer(logit_bias={letter: 100}) == greedy  # refused by the grammar: its mask wins
    llm.engine.core.blocks.check_integrity()
