"""A KV pool smaller than the model's context: the context is capped at the pool, so a request that
could never fit it is refused up front instead of preempting itself forever and holding up the
queue behind it; one that fills the pool exactly runs to its end beside others (they are preempted,
it is not)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM, RequestOutput
from rillet.core.sampling_params import SamplingParams as P

TINY = {"kind": "shape", "shape": "tiny", "device": "cpu", "dtype": "float32", "quantization": "none"}
BLOCKS, BLOCK = 5, 8  # block 0 is reserved: 4 usable blocks, 32 tokens


def _llm(**sections: Any) -> LLM:
    cfg = {
        "model": TINY,
        "graphs": {"compile_mode": "none"},
        "cache": {"num_blocks": BLOCKS, "block_size": BLOCK},
        "scheduler": {"max_num_batched_tokens": 16, "max_num_seqs": 4},
        **sections,
    }
    return LLM(config_from_dict(cfg))


def _generate(llm: LLM, prompts: list[list[int]], params: P) -> list[RequestOutput]:
    """generate() on a thread, so a stalled engine fails the test instead of hanging it."""
    got: list[list[RequestOutput]] = []
    t = threading.Thread(target=lambda: got.append(llm.generate(prompts, params)), daemon=True)
    t.start()
    t.join(120)
    assert got, "the engine stalled"
    return got[0]


def test_the_context_is_capped_at_the_pool_and_longer_requests_are_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING), _llm() as llm:
        eng = llm.engine
        assert eng.max_model_len == (BLOCKS - 1) * BLOCK
        assert any("cache.num_blocks" in r.getMessage() for r in caplog.records)
        with pytest.raises(ValueError, match="context length 32"):
            eng.add_request("too-long-prompt", list(range(3, 43)), P(max_tokens=1))
        with pytest.raises(ValueError, match="context length 32"):
            eng.add_request("too-long-answer", list(range(3, 23)), P(max_tokens=13))
        assert eng.core.blocks.num_used == 0


@pytest.mark.parametrize(
    "sections",
    [
        {},
        {"engine": {"overlap": "on", "overlap_depth": 2}},
        {"speculative": {"method": "ngram", "row_cost": 0.0, "ngram_min": 1}},
    ],
    ids=["plain", "overlap-2", "ngram"],
)
def test_a_request_that_fills_the_pool_runs_to_its_end_beside_others(sections: dict[str, Any]) -> None:
    with _llm(**sections) as llm:
        full = [3, 4, 5, 6] * 3  # 12 + 20 = 32 tokens: every block of the pool
        short = [7, 8, 9]
        params = P(max_tokens=20, temperature=0.0, ignore_eos=True)
        outs = _generate(llm, [full, short, short[::-1]], params)
        assert [len(o.outputs[0].token_ids) for o in outs] == [20, 20, 20]
        assert llm.engine.stats().preemptions > 0  # they did not fit together
        alone = _generate(llm, [full], params)
        assert alone[0].outputs[0].token_ids == outs[0].outputs[0].token_ids
        core = llm.engine.core
        core.blocks.check_integrity()
        assert core.blocks.num_used == 0
