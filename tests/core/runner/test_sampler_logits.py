"""What the sampler does to a row's logits before it draws: top-k/top-p/min-p masks (against a
plain reference on a large vocabulary), repetition/presence/frequency penalties (HF and OpenAI
rules), logprobs (after penalties, top-n sorted) and min_tokens holding back EOS and stop ids."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from core_helpers.sampler_rows import CPU, EOS, seq
from rillet.core.runner import logits_processors
from rillet.core.runner.logits_processors import (
    TokenHistory,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
)
from rillet.core.runner.sampler import Sampler

pytestmark = pytest.mark.isa  # run again under an AVX2 cap (tests/test_isa_cap.py)


def test_top_k_top_p_keeps_exactly_the_smallest_prefix() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    out = apply_top_k_top_p(logits, torch.tensor([2, 4]), torch.tensor([2.0, 0.5]))
    assert torch.isfinite(out).tolist() == [[True, True, False, False], [True, True, False, False]]
    assert torch.equal(out[0, :2], logits[0, :2])


def reference_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> set[int]:
    """Plain per-row reference: sort, cut at k, renormalise, keep until the mass reaches top_p."""
    order = logits.sort(descending=True).indices.tolist()[:top_k]
    probs = logits[order].softmax(-1).tolist()
    keep, mass = [], 0.0
    for token, p in zip(order, probs, strict=True):
        keep.append(token)
        mass += p
        if mass >= top_p:
            break
    return set(keep)


@pytest.mark.parametrize(
    ("scale", "top_k", "sorted_sizes"),
    [
        (0.3, [5000, 1000, 200, 5000], [1024, 5000]),  # flat: the best 1024 hold < top_p, full sort
        (8.0, [5000, 1000, 200, 5000], [1024]),  # peaked: the best-1024 prefix is exact
        (8.0, [5000, 3000, 200, 5000], [1024, 5000]),  # top_k = 3000 needs its whole set
    ],
)
def test_top_k_top_p_matches_reference_on_a_large_vocabulary(
    monkeypatch: pytest.MonkeyPatch, scale: float, top_k: list[int], sorted_sizes: list[int]
) -> None:
    sizes: list[int] = []
    inner = logits_processors._keep_best_prefix

    def spy(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor, size: int) -> Any:
        sizes.append(size)
        return inner(logits, k, p, size)

    monkeypatch.setattr(logits_processors, "_keep_best_prefix", spy)
    logits = torch.randn(4, 5000, generator=torch.Generator().manual_seed(5)) * scale
    top_p = [0.9, 0.95, 0.8, 0.5]
    out = apply_top_k_top_p(logits, torch.tensor(top_k), torch.tensor(top_p))
    assert sizes == sorted_sizes
    for row in range(4):
        kept = set(torch.isfinite(out[row]).nonzero().flatten().tolist())
        assert kept == reference_top_k_top_p(logits[row], top_k[row], top_p[row])
        assert torch.equal(out[row][list(kept)], logits[row][list(kept)])


def test_min_p_threshold_is_relative_to_the_best_token() -> None:
    logits = torch.tensor([[0.0, -math.log(2.0), -math.log(8.0)]])  # p relative to max: 1, 1/2, 1/8
    assert torch.isfinite(apply_min_p(logits, torch.tensor([0.25]))).tolist() == [[True, True, False]]
    assert torch.isfinite(apply_min_p(logits, torch.tensor([0.0]))).all()


def test_penalties_follow_hf_and_openai_rules() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, -1.0], [2.0, -2.0, 1.0, 0.5, -1.0]])
    # row 1: token 0 only in the prompt, token 1 twice and token 2 once in the output; row 0 untouched
    history = TokenHistory.of([seq(0, prompt=[0, 0, 2], output=[1, 2, 1])], [1], CPU)
    knobs = torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.5, 0.25]])
    apply_penalties(logits, history, knobs[:, 0], knobs[:, 1], knobs[:, 2])
    # 2/2; -2*2 - 0.5 - 2*0.25; 1/2 - 0.5 - 0.25; unseen tokens unchanged
    assert logits.tolist() == [[2.0, -2.0, 1.0, 0.5, -1.0], [1.0, -5.0, -0.25, 0.5, -1.0]]


def test_penalties_match_the_dense_formula() -> None:
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 40, (3, 55), generator=gen).tolist()
    seqs = [seq(i, prompt=row[:30], output=row[30:]) for i, row in enumerate(ids)]
    logits = torch.randn(3, 40, generator=gen)
    rep, pres, freq = (
        torch.tensor([1.3, 0.7, 1.0]),
        torch.tensor([0.5, -1.0, 0.0]),
        torch.tensor([0.2, 0.3, -0.4]),
    )
    seen = torch.zeros(3, 40, dtype=torch.bool)
    counts = torch.zeros(3, 40)
    for row, s in enumerate(seqs):
        seen[row, s.prompt_ids + s.output_ids] = True
        counts[row] = torch.bincount(torch.tensor(s.output_ids), minlength=40).float()
    r = rep[:, None]
    expected = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    expected -= pres[:, None] * (counts > 0) + freq[:, None] * counts
    apply_penalties(logits, TokenHistory.of(seqs, [0, 1, 2], CPU), rep, pres, freq)
    assert torch.allclose(logits, expected, atol=1e-6)


def test_penalties_steer_greedy_choice() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0, 0.0]])
    sampler = Sampler(4, (), CPU)
    assert sampler.sample(logits, [seq(0, temperature=0.0)]).token_ids == [0]
    rep = seq(0, prompt=[0], temperature=0.0, repetition_penalty=1.1)
    assert sampler.sample(logits, [rep]).token_ids == [1]
    freq = seq(0, prompt=[0], output=[0], temperature=0.0, frequency_penalty=0.2)
    assert sampler.sample(logits, [freq]).token_ids == [1]
    prompt_only = seq(0, prompt=[0], temperature=0.0, presence_penalty=2.0)  # output-only rule
    assert sampler.sample(logits, [prompt_only]).token_ids == [0]


def test_logprobs_match_log_softmax_and_top_n_is_sorted() -> None:
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(3))
    sampler = Sampler(64, (EOS,), CPU, seed=0)
    seqs = [seq(0, temperature=0.0, logprobs=5), seq(1), seq(2, temperature=0.7, logprobs=0)]
    result = sampler.sample(logits, seqs)
    expected = logits.log_softmax(-1)
    assert result.logprobs[1] is None
    greedy = result.logprobs[0]
    assert greedy is not None and greedy.token_id == result.token_ids[0] == int(logits[0].argmax())
    values, ids = expected[0].topk(5)
    assert [t for t, _ in greedy.top] == ids.tolist()
    assert [lp for _, lp in greedy.top] == pytest.approx(values.tolist(), abs=1e-6)
    assert greedy.logprob == pytest.approx(greedy.top[0][1], abs=1e-6)
    sampled = result.logprobs[2]
    assert sampled is not None and sampled.top == []
    assert sampled.logprob == pytest.approx(float(expected[2, result.token_ids[2]]), abs=1e-6)


def test_logprobs_are_taken_after_penalties() -> None:
    logits = torch.tensor([[1.0, 1.0, 0.0]])
    s = seq(0, output=[0], temperature=0.0, presence_penalty=1.0, logprobs=2)
    lp = Sampler(3, (), CPU).sample(logits, [s]).logprobs[0]
    expected = torch.tensor([0.0, 1.0, 0.0]).log_softmax(-1)
    assert lp is not None and lp.token_id == 1
    assert lp.top[0][0] == 1
    assert lp.top[0][1] == pytest.approx(float(expected[1]), abs=1e-6)
    assert lp.top[1][1] == pytest.approx(float(expected[0]), abs=1e-6)


def test_min_tokens_suppresses_eos_and_stop_ids() -> None:
    logits = torch.tensor([[0.0, 1.0, 5.0, 9.0, 0.0]])  # EOS (3) best, then stop id 2
    sampler = Sampler(5, (EOS,), CPU)
    early = seq(0, output=[1], temperature=0.0, min_tokens=2, stop_token_ids=(2,))
    assert sampler.sample(logits, [early]).token_ids == [1]
    with_ignore = seq(0, output=[1], temperature=0.0, min_tokens=2, ignore_eos=True)
    assert sampler.sample(logits, [with_ignore]).token_ids == [2]
    done = seq(0, output=[1, 1], temperature=0.0, min_tokens=2, stop_token_ids=(2,))
    assert sampler.sample(logits, [done]).token_ids == [EOS]
    random_rows = [seq(i, output=[], min_tokens=1, top_k=2) for i in range(200)]
    assert EOS not in sampler.sample(logits.expand(200, -1), random_rows).token_ids
