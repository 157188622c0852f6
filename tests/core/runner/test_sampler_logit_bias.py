"""logit_bias in the sampler: it bans and forces tokens in greedy and sampled rows, comes before
penalties and logprobs, makes a row not plain greedy, and SamplingParams validates it and keeps it
as sorted pairs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from core_helpers.sampler_rows import CPU, EOS, seq
from rillet.core.errors import RequestError
from rillet.core.runner.sampler import Sampler
from rillet.core.sampling_params import SamplingParams

pytestmark = pytest.mark.isa  # run again under an AVX2 cap (tests/test_isa_cap.py)


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
