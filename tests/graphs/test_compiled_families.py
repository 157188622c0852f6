"""The compiled CPU decode step (torch.compile, fullgraph: a graph break fails the compile) for
each new model family: sliding-window and soft-capping attention in the graph-safe decode, the
MoE router and its expert dispatch op inside the graph. The compiled engine's greedy tokens equal
transformers' fp32 generate, batched, in a pool that preempts, with prompts chunked. One compile
per family (buckets from 2: rows == 1 run as 2 rows of the same graph)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from engine_hooks import hold_first_step
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.runner.model_runner import ModelRunner
from rillet.core.sampling_params import SamplingParams
from rillet.graphs.interface import DecodeBatch

pytestmark = pytest.mark.compiled

LENGTHS = [3, 17, 9, 30, 1, 20, 25, 12]
NEW = 10


@pytest.mark.parametrize("family", ["qwen3", "gemma2", "gemma3_text", "phi3", "mixtral", "qwen3_moe"])
def test_compiled_family_matches_transformers(tiny_hf_model: Any, family: str) -> None:
    folder, hf = tiny_hf_model(family)
    prompts = [[(7 * i + 3 * k) % 250 + 1 for k in range(n)] for i, n in enumerate(LENGTHS)]
    want = []
    for p in prompts:
        with torch.inference_mode():
            g = hf.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW)
        want.append(g[0, len(p) :].tolist())
    cfg = config_from_dict(
        {
            # phi3: a table of its original 48 positions keeps LongRoPE's short factors
            "model": {"path": str(folder), "kind": "hf", "dtype": "float32", "max_model_len": 48},
            "graphs": {"enabled": "on", "buckets": [2, 4, 8]},
            "cache": {"num_blocks": 16, "block_size": 8},
            "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 24},
        }
    )
    with LLM(cfg) as llm:
        runner = llm.engine.core.runner
        assert isinstance(runner, ModelRunner) and runner.graph_runner is not None
        compiled = runner.graph_runner.compiled
        assert compiled is not None and compiled.wait(timeout=900), "compile did not finish"
        assert compiled.failed is None, compiled.failed  # a graph break would be this error
        rows: list[int] = []
        fn = compiled.fn

        def spy(batch: DecodeBatch) -> torch.Tensor:
            rows.append(batch.num_rows)
            return fn(batch)

        compiled.fn = spy
        preempted: list[int] = []
        sched = llm.engine.core.scheduler
        preempt = sched._preempt

        def spy_preempt(seq: Any) -> None:
            preempted.append(seq.seq_id)
            preempt(seq)

        sched._preempt = spy_preempt  # type: ignore[method-assign]
        params = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
        # all 8 admitted together whatever the machine's speed: the pool (15 blocks) then must preempt
        hold_first_step(llm.engine, len(prompts))
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        assert got == want
        assert rows and max(rows) > 1, "decode steps were meant to take the compiled step"
        assert preempted, "the pool was meant to preempt"
        llm.engine.core.blocks.check_integrity()
