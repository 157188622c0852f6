"""The speculative verify step compiled by torch.compile on CPU (graphs/verify.py) gives the same
tokens as the eager verify step, in the whole engine, on a tiny model: batches of 1 (its own
graph: one row, no padding row), 3 and 4 rows, drafts of every length up to k (each step padded to
its longest row, Q dynamic), no graph break, and no compile after the two verify graphs; over the
default KV pool and an int8 one. Also verify steps run as decode rows (the small-batch step's way)."""

from __future__ import annotations

from typing import Any

import pytest
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.runner.model_runner import ModelRunner
from rillet.core.sampling_params import SamplingParams
from rillet.graphs.aot.step import ByRows
from torch._dynamo.utils import counters

pytestmark = pytest.mark.compiled

PROMPTS = [[(7 * i + 3 * k) % 250 + 1 for k in range(3 + 2 * i)] * 3 for i in range(4)]


@pytest.mark.parametrize("kv_dtype", ["auto", "int8"])
def test_compiled_verify_matches_eager(tiny_hf_model: Any, kv_dtype: str) -> None:
    folder, _ = tiny_hf_model("llama")
    cfg = config_from_dict(
        {
            "model": {"path": str(folder), "kind": "hf", "dtype": "float32", "device": "cpu"},
            "cache": {"dtype": kv_dtype},
            "graphs": {"enabled": "on", "buckets": [1, 2, 4, 8], "short_prefill": 0},  # Q <= 4
            "speculative": {"method": "ngram", "num_tokens": 3, "max_batch": 4},
        }
    )
    with LLM(cfg) as llm:
        runner = llm.engine.core.runner
        assert isinstance(runner, ModelRunner) and runner.graph_runner is not None
        gr = runner.graph_runner
        assert gr.compiled is not None and gr.verify_compiled is not None
        assert gr.compiled.wait(timeout=900), "compile did not finish"
        assert gr.compiled.failed is None and gr.verify_compiled.failed is None, gr.verify_compiled.failed
        cv = gr.verify_compiled
        assert cv.ready and cv.ready_1 and gr.verify_queries == 4
        shapes: list[tuple[int, int]] = []  # (rows, Q) of each compiled verify call
        fn = cv.fn

        def spy(batch: Any) -> Any:
            shapes.append(tuple(batch.input_ids.shape))
            return fn(batch)

        cv.fn = spy

        def generate(n: int, compiled: bool) -> list[list[int]]:
            assert gr.compiled is not None
            gr.compiled.ready = compiled  # off: decode and verify steps run eager
            try:
                params = [
                    SamplingParams(max_tokens=14 + i, temperature=0.0, ignore_eos=True) for i in range(n)
                ]
                return [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:n], params)]
            finally:
                gr.compiled.ready = True

        graphs = int(counters["stats"]["unique_graphs"])
        for n in (1, 3, 4):
            runs = gr.num_verify_runs
            assert generate(n, compiled=True) == generate(n, compiled=False), n
            assert gr.num_verify_runs > runs, f"batch {n}: no verify step took the compiled graph"
        assert int(counters["stats"]["unique_graphs"]) == graphs  # nothing compiled again
        assert any(rows == 1 for rows, _ in shapes)  # batch 1 without a padding row
        assert len({q for _, q in shapes}) > 1 and all(2 <= q <= 4 for _, q in shapes)  # Q per step
        spec = llm.engine.core.spec
        assert spec is not None and spec.stats.accepted > 0
        llm.engine.core.blocks.check_integrity()
        # With a small-batch decode step in use (graphs.small_batch, saved steps only) a verify
        # step of at most its rows x queries runs as decode rows through it (graphs/verify.py
        # as_decode_rows): the compiled decode function stands in for both steps here
        decode = gr.compiled.fn
        gr.compiled.fn = ByRows(decode, decode, 4)  # type: ignore[arg-type]
        expanded = gr.num_verify_as_decode
        for n in (1, 3):
            assert generate(n, compiled=True) == generate(n, compiled=False), n
        assert gr.num_verify_as_decode > expanded
        llm.engine.core.blocks.check_integrity()
