"""Every model family through the whole engine against transformers, greedy, float32, token for
token: tiny random Qwen3, Gemma 2, Gemma 3, Phi-3 (LongRoPE), Mixtral and Qwen3-MoE models
(tiny_models/hf_folders.py's FAMILY_DEFAULTS), batched, with a pool small enough to preempt, a token budget
small enough to chunk prompts, and a second batch whose prompts extend the first's (prefix-cache
hits). Gemma's windows are 8 tokens, the prompts up to 40: sliding layers mask most of the context.
Phi-3's original context is 48 positions: served with max_model_len 48 it keeps LongRoPE's short
factors (transformers' choice for sequences that fit), with 256 the long ones (its choice for
prompts longer than 48)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams

LENGTHS = [3, 17, 9, 30, 1, 20, 40]
NEW = 12
# (family, max_model_len or None, prompt lengths, blocks of 8 in the preempting pool)
CASES = [
    ("qwen3", None, LENGTHS, 12),
    ("gemma2", None, LENGTHS, 12),
    ("gemma3_text", None, LENGTHS, 12),
    ("phi3", 48, [3, 17, 9, 30, 1, 20], 12),  # every sequence within 48 positions: short factors
    ("phi3", None, [49, 50, 52, 55], 15),  # every prompt past 48: long factors; 2 fit, then grow
    ("mixtral", None, LENGTHS, 12),
    ("qwen3_moe", None, LENGTHS, 12),
]

Prompts = list[list[int]]


def family_prompts(lengths: list[int] = LENGTHS) -> tuple[Prompts, Prompts]:
    """A first batch, then a second whose prompts extend the first's long ones."""
    first = [[(7 * i + 3 * k) % 250 + 1 for k in range(n)] for i, n in enumerate(lengths)]
    second = [p + [(11 * k) % 250 + 1 for k in range(5)] for p in first if len(p) >= 16]
    return first, second


def hf_tokens(hf: Any, prompts: Prompts, new: int = NEW) -> list[list[int]]:
    """transformers' generate(), one prompt at a time (no padding effects)."""
    out = []
    for p in prompts:
        with torch.inference_mode():
            g = hf.generate(torch.tensor([p]), max_new_tokens=new, do_sample=False, min_new_tokens=new)
        out.append(g[0, len(p) :].tolist())
    return out


def run_engine(
    sections: dict[str, Any], batches: list[Prompts], new: int = NEW
) -> tuple[list[list[list[int]]], int, list[int]]:
    """-> tokens per batch, preemptions, cached prompt tokens of the last batch."""
    preempted: list[int] = []
    with LLM(config_from_dict(sections)) as llm:
        sched = llm.engine.core.scheduler
        orig = sched._preempt

        def spy(seq: Any) -> None:
            preempted.append(seq.seq_id)
            orig(seq)

        sched._preempt = spy  # type: ignore[method-assign]
        params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
        outs = [llm.generate(b, params) for b in batches]
        core = llm.engine.core
        core.blocks.check_integrity()
        assert core.blocks.num_used == 0
    tokens = [[o.outputs[0].token_ids for o in batch] for batch in outs]
    return tokens, len(preempted), [o.outputs[0].cached_tokens for o in outs[-1]]


@pytest.mark.parametrize(("family", "max_len", "lengths", "pool"), CASES, ids=lambda x: str(x) if x else "")
def test_family_matches_transformers(
    tiny_hf_model: Any, family: str, max_len: int | None, lengths: list[int], pool: int
) -> None:
    folder, hf = tiny_hf_model(family)
    batches = list(family_prompts(lengths))
    want = [hf_tokens(hf, b) for b in batches]
    model = {"path": str(folder), "kind": "hf", "dtype": "float32", "max_model_len": max_len}
    for name, sections in {
        "plain": {},
        "preempting-pool": {"cache": {"num_blocks": pool, "block_size": 8}},
        "chunked-prefill": {"scheduler": {"max_num_batched_tokens": 5, "max_num_seqs": 3}},
    }.items():
        got, preemptions, cached = run_engine({"model": model, **sections}, batches)
        assert got == want, name
        if name == "preempting-pool":  # (its evictions leave the second batch little to hit)
            assert preemptions > 0, "the pool was meant to be too small for the whole batch"
        else:
            assert any(c > 0 for c in cached), f"{name}: the second batch should hit the prefix cache"
