"""Short prefill steps through the compiled multi-query step (graphs.short_prefill, CPU): built
with speculation off, taken by a prompt of at most that many tokens and by the uncached tail of a
prompt after a prefix-cache hit, never by a longer chunk; the tokens (and prompt logprobs) equal
the eager prefill's, no graph is compiled again for a new Q, and the KV pool is whole afterwards.
With speculation on, the same graph serves both kinds of step."""

from __future__ import annotations

from typing import Any

import pytest
from rillet.core.config import ConfigError, config_from_dict
from rillet.core.llm import LLM
from rillet.core.runner.model_runner import ModelRunner
from rillet.core.sampling_params import SamplingParams
from torch._dynamo.utils import counters

pytestmark = [pytest.mark.compiled, pytest.mark.short_prefill]

SHORT = 16
BLOCK = 8
SHORT_PROMPTS = [[(5 * i + 7 * k) % 250 + 1 for k in range(4 + 5 * i)] for i in range(3)]  # 4, 9, 14
LONG_PROMPT = [(11 * k) % 250 + 1 for k in range(3 * BLOCK + 5)]  # 29 tokens: eager, then a 5-token tail


def _config(folder: Any, short: int, spec: bool = False) -> Any:
    return config_from_dict(
        {
            "model": {"path": str(folder), "kind": "hf", "dtype": "float32", "device": "cpu"},
            "cache": {"block_size": BLOCK},
            "graphs": {"enabled": "on", "buckets": [1, 2, 4], "short_prefill": short},
            "speculative": {"method": "ngram" if spec else "off", "num_tokens": 3, "max_batch": 4},
        }
    )


def test_short_prefill_runs_compiled_and_matches_eager(tiny_hf_model: Any) -> None:
    folder, _ = tiny_hf_model("llama")
    with LLM(_config(folder, SHORT)) as llm:
        runner = llm.engine.core.runner
        assert isinstance(runner, ModelRunner) and runner.graph_runner is not None
        gr = runner.graph_runner
        assert llm.engine.core.spec is None  # speculation off: the graph is there for prefill
        assert gr.compiled is not None and gr.verify_compiled is not None and gr.verify_queries == SHORT
        assert gr.compiled.wait(timeout=900), "compile did not finish"
        assert gr.verify_compiled.failed is None, gr.verify_compiled.failed
        cv = gr.verify_compiled
        shapes: list[tuple[int, int]] = []  # (rows, Q) of each multi-query graph call
        fn = cv.fn

        def spy(batch: Any) -> Any:
            shapes.append(tuple(batch.input_ids.shape))
            return fn(batch)

        cv.fn = spy

        def generate(prompts: list[list[int]], compiled: bool, cached: bool = False) -> list[list[int]]:
            assert gr.compiled is not None
            if not cached:
                llm.engine.core.blocks.reset_prefix_cache()  # each prompt prefilled whole
            gr.compiled.ready = compiled  # off: every step runs eager
            try:
                params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
                return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
            finally:
                gr.compiled.ready = True

        graphs = int(counters["stats"]["unique_graphs"])
        for prompt in SHORT_PROMPTS:  # one row: its whole prompt in one multi-query step
            shapes.clear()
            assert generate([prompt], compiled=True) == generate([prompt], compiled=False)
            assert shapes == [(1, len(prompt))], shapes
        shapes.clear()
        assert generate(SHORT_PROMPTS[1:], compiled=True) == generate(SHORT_PROMPTS[1:], compiled=False)
        assert shapes == [(2, len(SHORT_PROMPTS[2]))]  # two rows, padded to the longer one

        # prompt logprobs read the multi-query graph's hidden states as they read eager ones
        scored = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, prompt_logprobs=2)
        shapes.clear()
        graphed = [o.prompt_logprobs for o in llm.generate(SHORT_PROMPTS[1:], scored)]
        assert shapes == [(2, len(SHORT_PROMPTS[2]))]
        gr.compiled.ready = False
        try:
            eager = [o.prompt_logprobs for o in llm.generate(SHORT_PROMPTS[1:], scored)]
        finally:
            gr.compiled.ready = True
        for g, e in zip(graphed, eager, strict=True):
            assert g is not None and e is not None and len(g) == len(e) and g[0] is None
            for a, b in zip(g[1:], e[1:], strict=True):
                assert a is not None and b is not None and a.token_id == b.token_id
                assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
                assert [t for t, _ in a.top] == [t for t, _ in b.top]

        shapes.clear()
        first = generate([LONG_PROMPT], compiled=True)
        assert shapes == []  # 29 tokens > graphs.short_prefill: the eager prefill
        again = generate([LONG_PROMPT], compiled=True, cached=True)  # 3 blocks cached: a 5-token tail
        assert shapes == [(1, len(LONG_PROMPT) - 3 * BLOCK)] and again == first
        assert int(counters["stats"]["unique_graphs"]) == graphs  # no compile for a new Q
        llm.engine.core.blocks.check_integrity()


def test_short_prefill_and_verify_steps_share_the_graph(tiny_hf_model: Any) -> None:
    folder, _ = tiny_hf_model("llama")
    with LLM(_config(folder, SHORT, spec=True)) as llm:
        gr = llm.engine.core.runner.graph_runner
        assert gr is not None and gr.verify_compiled is not None and gr.verify_queries == SHORT
        assert gr.compiled is not None and gr.compiled.wait(timeout=900), "compile did not finish"
        cv = gr.verify_compiled
        queries: list[int] = []
        fn = cv.fn

        def spy(batch: Any) -> Any:
            queries.append(batch.input_ids.shape[1])
            return fn(batch)

        cv.fn = spy
        prompts = [SHORT_PROMPTS[0] * 3, SHORT_PROMPTS[1][:3] * 5]  # 12 and 15 tokens that repeat

        def generate(compiled: bool) -> list[list[int]]:
            assert gr.compiled is not None
            llm.engine.core.blocks.reset_prefix_cache()
            gr.compiled.ready = compiled
            try:
                params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
                return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
            finally:
                gr.compiled.ready = True

        assert generate(compiled=True) == generate(compiled=False)
        spec = llm.engine.core.spec
        assert spec is not None and spec.stats.accepted > 0
        assert max(queries) > 4 and min(queries) <= 4  # prefill steps and verify steps (Q <= 1 + 3)
        llm.engine.core.blocks.check_integrity()


def test_short_prefill_off_keeps_prefill_eager(tiny_hf_model: Any) -> None:
    folder, _ = tiny_hf_model("llama")
    with LLM(_config(folder, 0)) as llm:
        gr = llm.engine.core.runner.graph_runner
        assert gr is not None and gr.verify_compiled is None and gr.verify_queries == 0


def test_short_prefill_graph_queries() -> None:
    """Q of the multi-query graph: graphs.short_prefill on the compiled step, the larger of it and
    a verify step's 1 + k with speculation, capped for soft-capped attention, none with LoRA or eager."""
    from types import SimpleNamespace

    from rillet.core.graph_setup import SOFTCAP_SHORT_PREFILL, verify_queries

    def model(softcap: float | None = None, lora: object = None) -> Any:
        backend = SimpleNamespace(graph_safe_decode=True)
        return SimpleNamespace(backend=backend, lora=lora, arch=SimpleNamespace(attn_softcap=softcap))

    def cfg(short: int, method: str = "off") -> Any:
        return config_from_dict({"graphs": {"short_prefill": short}, "speculative": {"method": method}})

    assert verify_queries(cfg(300), model(), "compiled") == 300
    assert verify_queries(cfg(300), model(), "eager") == 0
    assert verify_queries(cfg(300), model(lora=object()), "compiled") == 0
    assert verify_queries(cfg(300), model(softcap=50.0), "compiled") == SOFTCAP_SHORT_PREFILL
    assert verify_queries(cfg(4, "ngram"), model(), "compiled") == 1 + cfg(4).speculative.num_tokens
    assert (
        verify_queries(cfg(0, "ngram"), model(softcap=50.0), "compiled") == 1 + cfg(0).speculative.num_tokens
    )


@pytest.mark.parametrize("value", [1, -1, 4097])
def test_short_prefill_bad_values_name_the_key(value: int) -> None:
    with pytest.raises(ConfigError, match=r"graphs\.short_prefill"):
        config_from_dict({"graphs": {"short_prefill": value}})
