"""Speculative decoding under tensor parallelism: rank 0 drafts and verifies, every rank runs the
verify step's forward (the flat layout travels in the step broadcast), and the greedy tokens are
those of one rank without speculation."""

from __future__ import annotations

from typing import Any

from rillet.core.config import RilletConfig, config_from_dict
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams
from tp_helpers import TINY_TP


def test_ngram_speculation_at_tp2_matches_one_rank_without(tiny_hf_model: Any) -> None:
    folder, _ = tiny_hf_model("llama", **TINY_TP)
    prompts = [[(7 * i + 3 * k) % 250 + 1 for k in range(ln)] * 3 for i, ln in enumerate([3, 9, 5])]

    def run(tp: int, spec: str) -> tuple[list[list[int]], int]:
        cfg: RilletConfig = config_from_dict(
            {
                "model": {"path": str(folder), "kind": "hf", "dtype": "float32", "num_threads": 1},
                "cache": {"num_blocks": 24, "block_size": 8},
                "parallel": {"tensor_parallel_size": tp},
                "speculative": {"method": spec, "max_batch": 4},
            }
        )
        with LLM(cfg) as llm:
            assert (llm.engine.runtime.cluster is not None) == (tp > 1)
            outs = llm.generate(prompts, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
            core = llm.engine.core
            core.blocks.check_integrity()
            accepted = core.spec.stats.accepted if core.spec is not None else 0
            return [o.outputs[0].token_ids for o in outs], accepted

    want, _ = run(1, "off")
    got, accepted = run(2, "ngram")
    assert got == want
    assert accepted > 0
