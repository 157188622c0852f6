"""Tensor parallelism gives the same greedy tokens as one rank, in float32: random tiny Llama /
Mistral / Qwen2 / Gemma 2 / Qwen3-MoE (8 query / 4 KV heads) at TP=2 and the default SmolLM2
(9 query / 3 KV heads) at TP=3, batched, in a pool small enough to preempt, with chunked prefill
and prefix-cache hits; one tiny Llama over an int8 KV pool."""

from __future__ import annotations

from typing import Any

import pytest
from rillet.core.config import RilletConfig, config_from_dict
from rillet.core.llm import LLM, RequestOutput
from rillet.core.loaders.default_model import default_model_path
from rillet.core.sampling_params import SamplingParams
from rillet.core.tokenizer.tokenizer import Tokenizer
from tp_helpers import TINY_TP

# minutes on one core: its module is queued first under --dist loadfile (tests/conftest.py)
pytestmark = pytest.mark.slow

Prompts = list[list[int]]


def tiny_prompts() -> tuple[Prompts, Prompts]:
    """A first batch, then a second whose prompts extend the first's (prefix-cache hits)."""
    first = [[(7 * i + 3 * k) % 250 + 1 for k in range(ln)] for i, ln in enumerate([3, 17, 9, 30, 1, 20])]
    second = [p + [(11 * k) % 250 + 1 for k in range(5)] for p in first if len(p) >= 16]
    return first, second


def run(cfg: RilletConfig, batches: list[Prompts], new: int) -> tuple[list[list[RequestOutput]], int]:
    """-> outputs per batch, and how many preemptions the scheduler made."""
    preempted: list[int] = []
    with LLM(cfg) as llm:
        sched = llm.engine.core.scheduler
        orig = sched._preempt

        def spy(seq: Any) -> None:
            preempted.append(seq.seq_id)
            orig(seq)

        sched._preempt = spy  # type: ignore[method-assign]
        params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
        scored = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True, prompt_logprobs=2)
        # the first batch's prompts are scored too (so they take no prefix-cache hits; the second's do)
        outs = [llm.generate(b, scored if i == 0 else params) for i, b in enumerate(batches)]
        core = llm.engine.core
        core.blocks.check_integrity()
        assert core.blocks.num_used == 0
    return outs, len(preempted)


def tokens(outs: list[list[RequestOutput]]) -> list[list[list[int]]]:
    return [[o.outputs[0].token_ids for o in batch] for batch in outs]


def assert_same_prompt_logprobs(
    got: list[RequestOutput], want: list[RequestOutput], tol: float = 1e-4
) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.prompt_logprobs is not None and w.prompt_logprobs is not None
        assert len(g.prompt_logprobs) == len(w.prompt_logprobs) == len(g.prompt_ids)
        for a, b in zip(g.prompt_logprobs[1:], w.prompt_logprobs[1:], strict=True):
            assert a is not None and b is not None and a.token_id == b.token_id
            assert a.logprob == pytest.approx(b.logprob, abs=tol)


@pytest.mark.parametrize(
    ("model_type", "overrides", "overlap", "kv_dtype"),
    [
        ("llama", {}, "auto", "auto"),
        # overlapped steps: a decode's input token is the previous launch's, read on the device
        ("llama", {}, "on", "auto"),
        # an int8 KV pool: each rank quantizes its own KV heads, per token and head as one rank does
        ("llama", {}, "auto", "int8"),
        ("mistral", {"sliding_window": None}, "auto", "auto"),
        ("qwen2", {"tie_word_embeddings": True}, "auto", "auto"),
        # a dense family with sliding windows (8), soft-caps and sandwich norms, and an MoE one
        # (experts split along their intermediate dim, the router replicated, a dense layer)
        ("gemma2", {}, "auto", "auto"),
        ("qwen3_moe", {}, "auto", "auto"),
    ],
)
def test_tiny_models_tp2_match_tp1(
    tiny_hf_model: Any, model_type: str, overrides: dict[str, Any], overlap: str, kv_dtype: str
) -> None:
    folder, _ = tiny_hf_model(model_type, **TINY_TP, **overrides)
    batches = list(tiny_prompts())

    def cfg(tp: int) -> RilletConfig:
        return config_from_dict(
            {
                "model": {"path": str(folder), "kind": "hf", "dtype": "float32", "num_threads": 1},
                "cache": {"num_blocks": 10, "block_size": 8, "dtype": kv_dtype},
                "scheduler": {"max_num_batched_tokens": 16, "max_num_seqs": 4},
                "parallel": {"tensor_parallel_size": tp},
                "engine": {"overlap": overlap},
            }
        )

    want, _ = run(cfg(1), batches, 10)
    got, preemptions = run(cfg(2), batches, 10)
    assert tokens(got) == tokens(want)
    assert_same_prompt_logprobs(got[0], want[0])
    assert preemptions > 0, "the pool was meant to be too small for the whole batch"
    assert any(o.outputs[0].cached_tokens > 0 for o in got[1]), "the second batch should hit the prefix cache"


def test_default_model_tp3_matches_tp1() -> None:
    """SmolLM2-135M (GGUF, Q4_1 dequantized to float32): 3 query heads and 1 KV head per rank."""
    prompts = [
        "Once upon a time, in a small village at the edge of a dark forest, there lived an old man who",
        "def fibonacci(n):",
        "The capital of France is",
    ]
    base: dict[str, Any] = {
        "model": {"dtype": "float32", "quantization": "none", "num_threads": 1, "max_model_len": 256},
        "cache": {"num_blocks": 7, "block_size": 8},
        "scheduler": {"max_num_batched_tokens": 32, "max_num_seqs": 3},
    }
    tp1 = config_from_dict(base)
    tp3 = config_from_dict({**base, "parallel": {"tensor_parallel_size": 3}})
    tok = Tokenizer.from_gguf(default_model_path())
    ids = [tok.encode(p) for p in prompts]
    batches = [ids, [ids[0] + ids[1], ids[0] + ids[2]]]  # the second starts with the first's long prompt
    want, _ = run(tp1, batches, 8)
    got, preemptions = run(tp3, batches, 8)
    assert tokens(got) == tokens(want)
    assert [o.outputs[0].text for o in got[0]] == [o.outputs[0].text for o in want[0]]
    assert_same_prompt_logprobs(got[0], want[0], 1e-3)  # a 576-wide all-reduce sums in another order
    assert preemptions > 0
    assert any(o.outputs[0].cached_tokens > 0 for o in got[1])
