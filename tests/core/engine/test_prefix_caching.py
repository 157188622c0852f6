"""Automatic prefix caching on the default model: identical greedy outputs with caching on and off
for a mixed chat workload, real reuse, and eviction under a pool too small to keep everything."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams

SYSTEM = "You are a terse assistant. Answer in one short sentence. " * 3
GREEDY = SamplingParams(max_tokens=6, temperature=0.0)
# Pinned: the default (quantization auto) would run int4 with bf16 activations.
FP32 = {"dtype": "float32"}


def chat(tok: Any, *turns: str) -> list[int]:
    msgs = [{"role": "system", "content": SYSTEM}]
    for i, t in enumerate(turns):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": t})
    ids: list[int] = tok.encode(tok.apply_chat_template(msgs), add_special_tokens=False)
    return ids


def waves(tok: Any) -> list[list[list[int]]]:
    """Each wave is submitted together (same step); later waves reuse what earlier ones cached."""
    base = chat(tok, "What is the capital of France?")
    return [
        # two identical prompts in the same step, plus an unrelated one
        [base, list(base), tok.encode("Completely unrelated text about gardening and tomatoes.")],
        # multi-turn: the history of wave 1 resent; the shared system prompt; an exact prefix
        [
            chat(tok, "What is the capital of France?", "Paris.", "And of Italy?"),
            chat(tok, "Name a prime number."),
            base[: len(base) // 2],
        ],
        # diverging inside a block: same first 20 tokens, then different
        [base[:20] + tok.encode(" zebra crossing"), base[:20] + tok.encode(" quantum physics")],
    ]


def run(cache: dict[str, Any]) -> tuple[list[list[int]], LLM]:
    llm = LLM(config_from_dict({"model": FP32, "cache": cache}))
    outs: list[list[int]] = []
    for wave in waves(llm.tokenizer):
        res = llm.generate(wave, GREEDY)
        outs += [r.outputs[0].token_ids for r in res]
        llm.engine.core.blocks.check_integrity()
    return outs, llm


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    outs, llm = run({"prefix_caching": False, "num_blocks": 128})
    assert llm.engine.core.blocks.stats.hit_tokens == 0
    llm.close()
    return outs


def test_outputs_identical_with_prefix_caching(reference: list[list[int]]) -> None:
    outs, llm = run({"prefix_caching": True, "num_blocks": 128, "block_size": 16})
    try:
        assert outs == reference
        stats = llm.engine.core.blocks.stats
        assert stats.hit_tokens > 0 and llm.engine.stats().cached_blocks > 0
        assert llm.engine.core.blocks.num_used == 0
    finally:
        llm.close()


def test_cached_tokens_reported_per_request() -> None:
    with LLM(config_from_dict({"model": FP32, "cache": {"num_blocks": 128, "block_size": 16}})) as llm:
        ids = chat(llm.tokenizer, "Tell me about the moon.")
        cold = llm.generate([ids], GREEDY)[0].outputs[0]
        warm = llm.generate([ids], GREEDY)[0].outputs[0]
        assert cold.cached_tokens == 0
        assert warm.cached_tokens == (len(ids) - 1) // 16 * 16 > 0
        assert warm.token_ids == cold.token_ids


def test_eviction_under_a_small_pool_keeps_outputs_and_integrity(reference: list[list[int]]) -> None:
    # 14 blocks of 8 tokens: far too few to keep every wave's blocks cached (it preempts too).
    outs, llm = run({"prefix_caching": True, "num_blocks": 14, "block_size": 8})
    try:
        assert outs == reference
        assert llm.engine.core.blocks.stats.evictions > 0
        llm.engine.core.blocks.check_integrity()
        assert llm.engine.core.blocks.num_used == 0
    finally:
        llm.close()


@pytest.fixture(scope="module")
def int8_reference() -> list[list[int]]:
    outs, llm = run({"prefix_caching": False, "num_blocks": 128, "dtype": "int8"})
    llm.close()
    return outs


@pytest.mark.parametrize(("num_blocks", "block_size"), [(128, 16), (14, 8)], ids=["hits", "evicts"])
def test_int8_pool_hits_give_the_tokens_of_misses(
    int8_reference: list[list[int]], num_blocks: int, block_size: int
) -> None:
    """cache.dtype int8: a prefix-cache hit reads the codes a miss wrote and attended over (every
    attention sees K/V as the cache stores them), so hits, evictions and preemptions (14 blocks of
    8 tokens) change no token; the pool is whole afterwards."""
    cache = {"prefix_caching": True, "num_blocks": num_blocks, "block_size": block_size, "dtype": "int8"}
    outs, llm = run(cache)
    try:
        assert llm.engine.core.runner.kv_caches[0].k.dtype == torch.int8  # type: ignore[attr-defined]
        assert outs == int8_reference
        assert llm.engine.core.blocks.stats.hit_tokens > 0
        llm.engine.core.blocks.check_integrity()
        assert llm.engine.core.blocks.num_used == 0
    finally:
        llm.close()


def test_n_copies_share_the_prompt_blocks() -> None:
    with LLM(config_from_dict({"model": FP32, "cache": {"num_blocks": 128, "block_size": 16}})) as llm:
        ids = chat(llm.tokenizer, "Pick a colour.")
        res = llm.generate([ids], SamplingParams(max_tokens=5, temperature=0.0), n=3)[0]
        toks = [o.token_ids for o in res.outputs]
        assert toks[0] == toks[1] == toks[2]  # greedy copies agree
        assert [o.cached_tokens for o in res.outputs[1:]] == [(len(ids) - 1) // 16 * 16] * 2
        llm.engine.core.blocks.check_integrity()
