"""Sampler: greedy, seeded determinism in mixed batches, truncation sets, penalties, logprobs, min_tokens."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from rillet.core.errors import RequestError
from rillet.core.runner import logits_processors
from rillet.core.runner.logits_processors import (
    TokenHistory,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
)
from rillet.core.runner.sampler import Sampler
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq

CPU = torch.device("cpu")
EOS = 3
# a fixed 10-token distribution; indices are already sorted best first
PROBS = [0.3, 0.2, 0.15, 0.1, 0.08, 0.07, 0.05, 0.03, 0.01, 0.01]


def seq(seq_id: int, prompt: list[int] | None = None, output: list[int] | None = None, **params: Any) -> Seq:
    s = Seq(seq_id=seq_id, request_id=f"r{seq_id}", prompt_ids=prompt or [0], params=SamplingParams(**params))
    s.output_ids = list(output or [])
    return s


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


# ---- logit_bias ------------------------------------------------------------------------------------


def test_logit_bias_bans_and_forces_greedy_and_sampled_rows() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    best = logits.argmax(-1).tolist()
    sampler = Sampler(50, (EOS,), CPU, seed=0)
    banned = [seq(i, temperature=0.0, logit_bias={best[i]: -100}) for i in range(4)]
    second = logits.topk(2, dim=-1).indices[:, 1].tolist()
    assert sampler.sample(logits, banned).token_ids == second
    forced = [seq(i, temperature=0.0 if i % 2 else 1.0, logit_bias={7: 100}) for i in range(4)]
    assert sampler.sample(logits, forced).token_ids == [7, 7, 7, 7]
    # next to unbiased rows, which keep their own choice
    mixed = [seq(0, temperature=0.0, logit_bias={7: 100}), seq(1, temperature=0.0)]
    assert sampler.sample(logits[:2], mixed).token_ids == [7, best[1]]


def test_logit_bias_comes_before_penalties_and_logprobs() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.0]])
    s = seq(0, output=[2], temperature=0.0, logit_bias={2: 3.0}, repetition_penalty=2.0, logprobs=1)
    lp = Sampler(3, (), CPU).sample(logits, [s]).logprobs[0]
    # token 2: 0 + 3 = 3, then the repetition penalty halves it (positive): 1.5 < 2; token 0 (the
    # prompt) is halved too
    expected = torch.tensor([0.5, 2.0, 1.5]).log_softmax(-1)
    assert lp is not None and lp.token_id == 1
    assert lp.top[0][1] == pytest.approx(float(expected[1]), abs=1e-6)
    assert torch.equal(logits, torch.tensor([[1.0, 2.0, 0.0]]))  # the caller's logits untouched


def test_a_biased_row_is_not_plain_greedy() -> None:
    params = SamplingParams(temperature=0.0, logit_bias={1: 1.0})
    assert not params.plain_greedy(0, (EOS,)) and SamplingParams(temperature=0.0).plain_greedy(0, (EOS,))


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({1: 100.5}, "must be in [-100, 100]"),
        ({-1: 1}, "non-negative integers"),
        ({"1": 1}, "non-negative integers"),
        ({1: float("nan")}, "must be a number"),
        ({1: True}, "must be a number"),
        ([(1, 1.0), (1, 2.0)], "given twice"),
    ],
)
def test_logit_bias_is_validated(value: Any, words: str) -> None:
    with pytest.raises(RequestError) as exc:
        SamplingParams(logit_bias=value)
    assert exc.value.param == "logit_bias" and words in exc.value.message


def test_logit_bias_is_normalised_to_sorted_pairs() -> None:
    assert SamplingParams(logit_bias={5: -1, 2: 3}).logit_bias == ((2, 3.0), (5, -1.0))


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
