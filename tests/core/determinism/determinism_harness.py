"""Harness of the deterministic-mode engine tests: a seeded sampled request, run through one engine
under every condition the issue names; its tokens and logprobs are compared bit for bit with the
same request run alone on a cold cache."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from rillet.core.llm import LLM, RequestOutput
from rillet.core.sampling_params import SamplingParams

BLOCK = 16
POOL = 80  # blocks (79 usable): a batch of 17 short requests fits, six long ones preempt
PROMPT_LEN = 70
REQUEST = SamplingParams(max_tokens=8, temperature=1.0, seed=7, logprobs=2, ignore_eos=True)


def engine_config(**model: Any) -> dict[str, Any]:
    return {
        "model": model,
        "engine": {"deterministic": "on"},
        "cache": {"num_blocks": POOL, "block_size": BLOCK, "prefix_caching": False},
        "scheduler": {"max_num_seqs": 17, "max_num_batched_tokens": 2048},
    }


@dataclass(frozen=True)
class Answer:
    tokens: list[int]
    logprobs: list[tuple[int, float, tuple[tuple[int, float], ...]]]  # (token, logprob, top-2)
    cached_tokens: int

    def same(self, other: Answer) -> bool:
        return self.tokens == other.tokens and self.logprobs == other.logprobs


class Harness:
    """One engine (deterministic on) and the request under test, `prompt` sampled with REQUEST."""

    def __init__(self, llm: LLM, vocab: int, seed: int = 0) -> None:
        self.llm = llm
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.prompt = self.tokens(PROMPT_LEN)

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(3, self.vocab) for _ in range(n)]

    def others(self, count: int, lo: int, hi: int, max_tokens: int = 8) -> list[tuple[list[int], Any]]:
        """Requests of mixed lengths and sampling settings to share the steps with."""
        kinds = [
            SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
            SamplingParams(max_tokens=max_tokens, temperature=0.8, seed=1, ignore_eos=True, logprobs=1),
            SamplingParams(max_tokens=max_tokens, temperature=1.2, top_k=20, top_p=0.9, ignore_eos=True),
            SamplingParams(max_tokens=max_tokens, temperature=1.0, top_p=0.5, seed=3, ignore_eos=True),
        ]
        return [(self.tokens(self.rng.randint(lo, hi)), kinds[i % len(kinds)]) for i in range(count)]

    def run(self, others: list[tuple[list[int], Any]] = (), at: int | None = None) -> Answer:  # type: ignore[assignment]
        """The request submitted with `others` in one go (it is admitted in position `at`, last by
        default); checks the KV pool is whole afterwards."""
        prompts = [p for p, _ in others]
        params = [s for _, s in others]
        at = len(prompts) if at is None else at
        prompts.insert(at, self.prompt)
        params.insert(at, REQUEST)
        out = self.llm.generate(prompts, params)
        self.llm.engine.core.blocks.check_integrity()
        return answer(out[at])

    def set_chunk(self, tokens: int) -> None:
        sched = self.llm.engine.core.scheduler
        sched.cfg = replace(sched.cfg, max_num_batched_tokens=tokens)

    def set_prefix_caching(self, on: bool) -> None:
        self.llm.engine.core.blocks.enable_prefix_caching = on


def answer(out: RequestOutput) -> Answer:
    o = out.outputs[0]
    assert o.logprobs is not None and o.finish_reason is not None and o.error is None
    lps = [(lp.token_id, lp.logprob, tuple(lp.top)) for lp in o.logprobs]
    return Answer(o.token_ids, lps, o.cached_tokens)
