"""The model runner's decode path through graphs/ on CPU: padded to a bucket (as a CUDA graph
replay would be) it gives the same tokens as the plain eager forward."""

from __future__ import annotations

from typing import Any

import torch
from rillet.core.config import GraphConfig, config_from_dict
from rillet.core.engine.scheduler import ScheduledBatch
from rillet.core.llm import LLM
from rillet.core.runner.graph_adapter import DecoderGraphAdapter
from rillet.core.runner.input_builder import InputBuilder
from rillet.core.runner.model_runner import ModelRunner
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq
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


def test_decode_only_step_with_a_non_final_one_token_chunk(tiny_hf_model: Any) -> None:
    """Issue 17 item 5: a token budget that leaves one token gives a prompt a 1-token chunk that is
    not its last: every row has one new token, 2 rows but 1 sequence to sample. The step is a
    prefill step (the chunk is not a decode), and with a graph runner present it samples that one
    row, as without."""
    folder, _ = tiny_hf_model("llama", num_hidden_layers=2)
    cfg = config_from_dict(
        {
            "model": {"path": str(folder), "kind": "hf"},
            "cache": {"num_blocks": 64, "block_size": 8},
            "graphs": {"enabled": "off"},
        }
    )
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    with LLM(cfg) as llm:
        eager = llm.engine.core.runner
        assert isinstance(eager, ModelRunner)
        padded = ModelRunner(
            eager.model,
            eager.kv_caches,
            eager.sampler,
            eager.block_size,
            eager.device,
            GraphRunner(
                DecoderGraphAdapter(eager.model, eager.kv_caches, eager.block_size),
                GraphConfig(enabled="off", buckets=(1, 2, 4)),
                max_num_seqs=4,
                max_blocks_per_seq=4,
                device="cpu",
                pad_eager=True,
            ),
        )
        results = []
        for runner, blocks in ((eager, (1, 2)), (padded, (3, 4))):
            a = Seq(0, "a", [11, 12, 13, 14, 15, 16], greedy, block_table=[blocks[0]])
            b = Seq(1, "b", [21, 22, 23, 24, 25], greedy, block_table=[blocks[1]])
            seqs, out = runner.step(ScheduledBatch([a, b], [6, 3]))  # a's whole prompt, b's first 3
            assert seqs == [a]
            a.output_ids.append(out.token_ids[0])
            a.num_computed, b.num_computed = 6, 3
            step = ScheduledBatch([a, b], [1, 1])  # a decodes; b's 4th of 5 prompt tokens
            # the builder counts the non-final chunk as a prefill: the step never takes the graph
            assert InputBuilder(8, torch.device("cpu")).build(step).meta.num_prefills == 1
            seqs, out = runner.step(step)
            assert seqs == [a] and len(out.token_ids) == 1
            results.append(out.token_ids)
        assert padded.graph_runner is not None and padded.graph_runner.num_padded_eager == 0
        assert results[0] == results[1]
