"""The whole engine (scheduler + paged cache + model + sampler) against transformers, greedy,
token for token: the default SmolLM2 model and random tiny Llama / Mistral / Qwen2 models, batched,
with a pool small enough to preempt and a token budget small enough to chunk prompts."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from engine_hooks import hold_first_step
from harness.hf_gguf import hf_default_model, hf_default_tokenizer
from rillet.core.config import RilletConfig, config_from_dict
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason

# minutes on one core: its module is queued first under --dist loadfile (tests/conftest.py)
pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "1, 2, 3, 4,",
    "Explain in one paragraph why the sky is blue, and mention Rayleigh scattering by name please.",
    "def fibonacci(n):",
    "Q: What is the largest planet in the solar system?\nA:",
    "Once upon a time, in a small village at the edge of a dark forest, there lived an old clockmaker who",
]
MAX_NEW = [12, 20, 8, 24, 16, 10, 18]  # different lengths: sequences leave the batch at different steps


def cfg(**sections: dict[str, Any]) -> RilletConfig:
    return config_from_dict({"model": {"dtype": "float32", "device": "cpu"}, **sections})


@pytest.fixture(scope="module")
def hf_reference() -> list[list[int]]:
    """transformers' own GGUF loader and generate(), one prompt at a time (no padding effects)."""
    tok, model = hf_default_tokenizer(), hf_default_model()
    outs = []
    for prompt, n in zip(PROMPTS, MAX_NEW, strict=True):
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            gen = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=2)
        outs.append(gen[0, ids.shape[1] :].tolist())
    return outs


def run_default(c: RilletConfig) -> tuple[list[list[int]], LLM]:
    llm = LLM(c)
    params = [SamplingParams(max_tokens=n, temperature=0.0) for n in MAX_NEW]
    outs = llm.generate(PROMPTS, params)
    return [o.outputs[0].token_ids for o in outs], llm


@pytest.mark.parametrize(
    "sections",
    [
        pytest.param({}, id="plain"),
        pytest.param({"cache": {"num_blocks": 14, "block_size": 8}}, id="preempting-pool"),
        pytest.param({"scheduler": {"max_num_batched_tokens": 8, "max_num_seqs": 4}}, id="chunked-prefill"),
    ],
)
def test_default_model_matches_transformers(hf_reference: list[list[int]], sections: dict[str, Any]) -> None:
    got, llm = run_default(cfg(**sections))
    try:
        assert got == hf_reference
        core = llm.engine.core
        core.blocks.check_integrity()
        assert core.blocks.num_used == 0
    finally:
        llm.close()


def test_small_pool_really_preempts() -> None:
    # 13 usable blocks of 8 tokens; the 7 prompts take 12 of them when admitted together (the
    # first step is held until all are in, so this holds whatever the machine's speed), and each
    # needs one more within its first 8 tokens, before any can finish: preemption is forced.
    c = cfg(cache={"num_blocks": 14, "block_size": 8})
    with LLM(c) as llm:
        hold_first_step(llm.engine, len(PROMPTS))
        preempted = []
        orig = llm.engine.core.scheduler._preempt

        def spy(seq: Any) -> None:
            preempted.append(seq.seq_id)
            orig(seq)

        llm.engine.core.scheduler._preempt = spy  # type: ignore[method-assign]
        llm.generate(PROMPTS, [SamplingParams(max_tokens=n, temperature=0.0) for n in MAX_NEW])
        assert preempted, "the pool was meant to be too small for the whole batch"
        llm.engine.core.blocks.check_integrity()


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [
        ("llama", {"num_hidden_layers": 3}),
        ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 1}),
        ("mistral", {"sliding_window": None}),
        ("qwen2", {"tie_word_embeddings": False}),
    ],
)
def test_tiny_models_match_transformers(
    tiny_hf_model: Any, model_type: str, overrides: dict[str, Any]
) -> None:
    folder, hf = tiny_hf_model(model_type, **overrides)
    prompts = [[(7 * i + 3 * k) % 250 + 1 for k in range(ln)] for i, ln in enumerate([3, 17, 9, 30, 1])]
    new = [10, 6, 14, 8, 12]
    want = []
    for p, n in zip(prompts, new, strict=True):
        with torch.inference_mode():
            g = hf.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
        want.append(g[0, len(p) :].tolist())
    for sections in (
        {},
        {"cache": {"num_blocks": 9, "block_size": 8}},
        {"scheduler": {"max_num_batched_tokens": 5, "max_num_seqs": 3}},
    ):
        c = config_from_dict({"model": {"path": str(folder), "kind": "hf", "dtype": "float32"}, **sections})
        with LLM(c) as llm:
            outs = llm.generate(
                prompts, [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in new]
            )
            assert [o.outputs[0].token_ids for o in outs] == want, sections
            assert all(o.outputs[0].finish_reason is FinishReason.LENGTH for o in outs)
            llm.engine.core.blocks.check_integrity()
            assert llm.engine.core.blocks.num_used == 0
