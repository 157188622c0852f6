"""engine.deterministic on: a seeded sampled request (temperature 1, seed 7, logprobs) gives the same
tokens and bit-identical logprobs alone on a cold cache, inside a batch of 16 others of mixed
lengths and sampling settings, after a partial and a full prefix-cache hit, with chunked prefill at
several chunk sizes, after preemption and recomputation, and with overlapped steps; on the default
model (int4 weights, int8 head) and on a tiny float32 Llama (padded dense matmuls), which also runs
over an int8 KV pool ("tiny+int8": per-token scales, so what a row reads back is batch-invariant
too). The compiled decode step is never used, so nothing switches paths mid-life."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from determinism_harness import PROMPT_LEN, Answer, Harness, engine_config
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams

# minutes on one core: its module is queued first under --dist loadfile (tests/conftest.py)
pytestmark = pytest.mark.slow

TINY_VOCAB, DEFAULT_VOCAB = 256, 49152


def _config(which: str, tiny_hf_model: Any, **engine: str) -> Any:
    if which.startswith("tiny"):
        folder, _ = tiny_hf_model("llama")
        cfg = engine_config(path=str(folder), kind="hf", dtype="float32")
    else:
        cfg = engine_config()
    if which.endswith("+int8"):
        cfg["cache"]["dtype"] = "int8"
    cfg["engine"].update(engine)
    return config_from_dict(cfg)


def _vocab(which: str) -> int:
    return TINY_VOCAB if which.startswith("tiny") else DEFAULT_VOCAB


@pytest.fixture(scope="module", params=["tiny", "default", "tiny+int8"])
def which(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def harness(which: str, tiny_hf_model: Any) -> Iterator[Harness]:
    with LLM(_config(which, tiny_hf_model)) as llm:
        kv = llm.engine.core.runner.kv_caches[0]  # type: ignore[attr-defined]
        assert (kv.k.dtype == torch.int8) == which.endswith("+int8")
        yield Harness(llm, _vocab(which))


@pytest.fixture(scope="module")
def reference(harness: Harness) -> Answer:
    alone = harness.run()
    assert len(alone.tokens) == 8 and alone.cached_tokens == 0
    assert harness.run() == alone  # and again
    return alone


def test_inside_a_batch_of_16_others(harness: Harness, reference: Answer) -> None:
    for at in (0, 16):
        got = harness.run(harness.others(16, 2, 40), at=at)
        assert got.same(reference), at


def test_after_a_partial_and_a_full_prefix_cache_hit(harness: Harness, reference: Answer) -> None:
    harness.set_prefix_caching(True)
    try:
        # a prompt sharing the request's first block (and no more) is cached first
        donor = harness.prompt[:20] + harness.tokens(30)
        harness.llm.generate([donor], SamplingParams(max_tokens=1))
        partial = harness.run()
        full = harness.run()
    finally:
        harness.set_prefix_caching(False)
    assert (partial.cached_tokens, full.cached_tokens) == (16, (PROMPT_LEN - 1) // 16 * 16)
    assert partial.same(reference) and full.same(reference)


def test_chunked_prefill_at_several_chunk_sizes(harness: Harness, reference: Answer) -> None:
    try:
        for chunk in (17, 29, 50):
            harness.set_chunk(chunk)
            assert harness.run(harness.others(3, 2, 30), at=1).same(reference), chunk
    finally:
        harness.set_chunk(2048)


def run_preempted(harness: Harness) -> Answer:
    """Six prompts of 12 blocks less 3 tokens and the request (5 blocks) fill 77 of the pool's 79
    blocks; the request, admitted last, is the first victim once the six need one more block each,
    4 tokens in, and it is recomputed (prompt + output so far) after them."""
    sched = harness.llm.engine.core.scheduler
    preempted: list[str] = []
    real = sched._preempt

    def spy(seq: Any) -> None:
        preempted.append(seq.request_id)
        real(seq)

    sched._preempt = spy  # type: ignore[method-assign]
    try:
        got = harness.run(harness.others(6, 189, 189, max_tokens=12))
    finally:
        del sched._preempt
    assert preempted, "the pool was meant to preempt"
    return got


def test_after_preemption_and_recomputation(harness: Harness, reference: Answer) -> None:
    assert run_preempted(harness).same(reference)


def test_the_compiled_decode_step_is_never_used(harness: Harness) -> None:
    # graphs.enabled is auto: without deterministic mode a CPU model would compile its decode step
    assert harness.llm.engine.core.runner.graph_runner is None  # type: ignore[attr-defined]


def test_with_overlapped_steps(which: str, tiny_hf_model: Any, reference: Answer) -> None:
    with LLM(_config(which, tiny_hf_model, overlap="on")) as llm:
        assert llm.engine.overlap
        h = Harness(llm, _vocab(which))
        assert h.run().same(reference)
        assert h.run(h.others(16, 2, 40), at=5).same(reference)
        if which.startswith("tiny"):
            assert run_preempted(h).same(reference)
            h.set_chunk(17)
            assert h.run(h.others(3, 2, 30), at=1).same(reference)
