"""The model runner's decode path through graphs/ on CPU: padded to a bucket (as a CUDA graph
replay would be) it gives the same tokens as the plain eager forward."""

from __future__ import annotations

from typing import Any

from rillet.core.config import GraphConfig, config_from_dict
from rillet.core.llm import LLM
from rillet.core.model_runner import DecoderGraphAdapter, ModelRunner
from rillet.core.sampling_params import SamplingParams
from rillet.graphs.runner import GraphRunner


def test_padded_graph_path_matches_plain_eager(tiny_hf_model: Any) -> None:
    folder, _ = tiny_hf_model("llama", num_hidden_layers=2)
    cfg = config_from_dict(
        {
            "model": {"path": str(folder), "kind": "hf"},
            "cache": {"num_blocks": 64, "block_size": 8},
            "graphs": {"enabled": "off"},
        }
    )
    prompts = [[(5 * i + k) % 200 + 1 for k in range(3 + 4 * i)] for i in range(5)]
    params = [SamplingParams(max_tokens=6 + 2 * i, temperature=0.0, ignore_eos=True) for i in range(5)]
    with LLM(cfg) as llm:
        plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        runner = llm.engine.core.runner
        assert isinstance(runner, ModelRunner) and runner.graph_runner is None
        gr = GraphRunner(
            DecoderGraphAdapter(runner.model, runner.kv_caches, runner.block_size),
            GraphConfig(enabled="off", buckets=(1, 2, 4, 8)),
            max_num_seqs=8,
            max_blocks_per_seq=16,
            device="cpu",
            pad_eager=True,
        )
        runner.graph_runner = gr
        padded = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        assert padded == plain
        assert gr.num_padded_eager > 0  # batches of 5, 4, 3 ... were padded to 8 and 4
        llm.engine.core.blocks.check_integrity()
