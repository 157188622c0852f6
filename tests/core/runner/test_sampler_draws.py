"""Sampler draws: greedy rows next to random ones, the caller's logits untouched, seeded rows
deterministic whatever their batch and position, truncation (top-k, top-p, min-p) within its set
and following the distribution, temperature, and when the LM head may give only the argmax."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from core_helpers.sampler_rows import CPU, EOS, seq
from rillet.core.runner.sampler import Sampler

pytestmark = pytest.mark.isa  # run again under an AVX2 cap (tests/test_isa_cap.py)

# a fixed 10-token distribution; indices are already sorted best first
PROBS = [0.3, 0.2, 0.15, 0.1, 0.08, 0.07, 0.05, 0.03, 0.01, 0.01]


def draw_many(n: int, seed: int = 0, **params: Any) -> torch.Tensor:
    """n independent draws from PROBS: one batch of n identical unseeded rows."""
    sampler = Sampler(len(PROBS), (), CPU, seed=seed)
    logits = torch.tensor(PROBS).log().expand(n, -1)
    return torch.tensor(sampler.sample(logits, [seq(i, **params) for i in range(n)]).token_ids)


def chi_square(samples: torch.Tensor, expected: list[float]) -> float:
    counts = torch.bincount(samples, minlength=len(expected)).tolist()
    n = len(samples)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, expected, strict=True) if p > 0)


def renormalised(probs: list[float], keep: set[int]) -> list[float]:
    total = sum(probs[i] for i in keep)
    return [p / total if i in keep else 0.0 for i, p in enumerate(probs)]


def test_greedy_is_argmax_also_next_to_random_rows() -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    sampler = Sampler(50, (EOS,), CPU, seed=0)
    greedy = [seq(i, temperature=0.0) for i in range(6)]
    assert sampler.sample(logits, greedy).token_ids == logits.argmax(-1).tolist()
    mixed = [seq(i, temperature=0.0 if i % 2 else 1.0) for i in range(6)]
    got = sampler.sample(logits, mixed).token_ids
    assert got[1::2] == logits.argmax(-1)[1::2].tolist()


def test_sample_leaves_logits_untouched() -> None:
    logits = torch.randn(2, 20)
    before = logits.clone()
    Sampler(20, (EOS,), CPU).sample(logits, [seq(0, min_tokens=2, repetition_penalty=1.5), seq(1, top_k=3)])
    assert torch.equal(logits, before)


def seeded_run(sampler: Sampler, position: int, batch: int, steps: int) -> list[int]:
    """Tokens of seq 7 (seed 1234) at `position` in a batch of unseeded / otherwise seeded rows."""
    rows = torch.Generator().manual_seed(99)
    target = seq(7, seed=1234, temperature=1.0, top_p=0.9)
    others = [seq(100 + i, seed=None if i % 2 else i, temperature=0.8) for i in range(batch - 1)]
    out = []
    for _ in range(steps):
        step_logits = torch.randn(8, 500, generator=rows)  # same sequence of logits in every run
        logits = torch.randn(batch, 500)
        logits[position] = step_logits[0]
        seqs = [*others[:position], target, *others[position:]]
        out.append(sampler.sample(logits, seqs).token_ids[position])
        target.output_ids.append(out[-1])  # the next step samples the next output position
    return out


def test_seeded_rows_are_deterministic_across_batch_and_position() -> None:
    alone = seeded_run(Sampler(500, (), CPU, seed=1), position=0, batch=1, steps=20)
    assert seeded_run(Sampler(500, (), CPU, seed=2), position=0, batch=5, steps=20) == alone
    assert seeded_run(Sampler(500, (), CPU, seed=3), position=3, batch=5, steps=20) == alone
    assert seeded_run(Sampler(500, (), CPU, seed=4), position=6, batch=7, steps=20) == alone
    assert len(set(alone)) > 5  # really sampling, not collapsing onto one token


def test_seeded_draws_depend_on_the_seed_and_the_output_position_only() -> None:
    logits = torch.zeros(1, 1000)  # uniform: every draw depends only on the generator

    def run(sampler: Sampler, s: Any, steps: int = 3) -> list[int]:
        out = []
        for _ in range(steps):
            out.append(sampler.sample(logits, [s]).token_ids[0])
            s.output_ids.append(out[-1])
        return out

    sampler = Sampler(1000, (), CPU)
    first = run(sampler, seq(5, seed=42))
    assert len(set(first)) == 3
    assert run(sampler, seq(5, seed=42)) == first  # the same seq id again, without a release
    sampler.release(5)
    assert run(Sampler(1000, (), CPU), seq(9, seed=42)) == first
    # a position sampled again (a speculative step's later position, as a view) draws the same
    s = seq(7, seed=42)
    s.output_ids, s.num_pending = [0, 0], 0
    assert sampler.sample(logits, [s]).token_ids[0] == first[2]
    assert run(sampler, seq(6, seed=43)) != first


@pytest.mark.parametrize(
    ("params", "keep"),
    [
        ({"top_k": 3}, {0, 1, 2}),
        ({"top_p": 0.55}, {0, 1, 2}),  # 0.3 + 0.2 < 0.55 <= 0.65
        ({"top_p": 0.45}, {0, 1}),
        ({"top_p": 0.01}, {0}),
        ({"min_p": 0.3}, {0, 1, 2, 3}),  # p >= 0.09
        ({"top_k": 5, "top_p": 0.8}, {0, 1, 2, 3}),  # top-p over the renormalised top-5 (0.83 of mass)
        ({"top_k": 4, "min_p": 0.5}, {0, 1, 2}),
    ],
)
def test_truncation_never_leaves_its_set_and_follows_the_distribution(params: dict, keep: set[int]) -> None:
    samples = draw_many(2000, **params)
    assert set(samples.tolist()) <= keep
    assert set(samples.tolist()) == keep  # every allowed token shows up in 2000 draws
    assert chi_square(samples, renormalised(PROBS, keep)) < 25.0  # df <= 3: p < 1e-4


def test_truncation_applies_only_to_the_rows_that_ask_for_it() -> None:
    sampler = Sampler(len(PROBS), (), CPU, seed=0)
    logits = torch.tensor(PROBS).log().expand(2000, -1)
    seqs = [seq(i, top_k=2) if i % 2 else seq(i, min_p=0.2 if i % 4 else 0.0) for i in range(2000)]
    tokens = torch.tensor(sampler.sample(logits, seqs).token_ids)
    assert set(tokens[1::2].tolist()) == {0, 1}
    assert set(tokens[2::4].tolist()) == {0, 1, 2, 3, 4, 5}  # min_p 0.2: p >= 0.06
    assert set(tokens[0::4].tolist()) == set(range(len(PROBS)))


def test_plain_sampling_and_temperature_follow_the_distribution() -> None:
    assert chi_square(draw_many(4000), PROBS) < 40.0  # df 9
    sharpened = [p**2 for p in PROBS]
    total = sum(sharpened)
    samples = draw_many(4000, seed=1, temperature=0.5)
    assert chi_square(samples, [p / total for p in sharpened]) < 40.0


def test_argmax_only_holds_for_plain_greedy_rows_alone() -> None:
    """The LM head may give a row its candidates alone (DecoderModel.compute_logits) only when no
    part of sampling reads more than the argmax: any other row in the step turns it off."""
    from rillet.core.structured.spec import GrammarSpec

    sampler = Sampler(len(PROBS), (EOS,), CPU, seed=0)
    plain = seq(0, temperature=0.0)
    assert sampler.argmax_only([plain, seq(1, temperature=0.0, max_tokens=4)])
    others = [
        seq(2, temperature=0.7),
        seq(3, temperature=0.0, logprobs=0),
        seq(4, temperature=0.0, repetition_penalty=1.1),
        seq(5, temperature=0.0, presence_penalty=0.5),
        seq(6, temperature=0.0, logit_bias={1: 5.0}),
        seq(7, temperature=0.0, min_tokens=2, max_tokens=4),
        seq(8, temperature=0.0, grammar=GrammarSpec("json_object")),
    ]
    for other in others:
        assert not sampler.argmax_only([plain, other]), other.params
    # min_tokens in force only until that many tokens are out
    assert sampler.argmax_only([seq(9, output=[5, 6], temperature=0.0, min_tokens=2, max_tokens=4)])
