"""params.prompt_logprobs: each prompt token's logprob (and top N) under the model's raw logits,
equal to transformers' log_softmax at the position before it, whatever the step layout: one
prefill, chunked prefills, batched beside other requests, a prompt whose blocks are in the prefix
cache (a request asking for them takes no hits; the others still do), after a preemption."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rillet.core.config import config_from_dict
from rillet.core.engine.scheduler import Scheduler
from rillet.core.llm import LLM, RequestOutput
from rillet.core.sampling_params import SamplingParams

PROMPTS = [[(11 * i + 7 * k) % 250 + 3 for k in range(9 + 13 * i)] for i in range(3)]  # 9, 22, 35 tokens
TOP = 3


def _llm(folder: Any, **sched: int) -> LLM:
    settings: dict[str, Any] = {
        "model": {"path": str(folder), "kind": "hf", "dtype": "float32"},
        "cache": {"block_size": 8},
    }
    if sched:
        settings["scheduler"] = sched
    return LLM(config_from_dict(settings))


def _reference(hf: Any, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob of prompt tokens 1.., top-TOP ids at each of those positions) from transformers."""
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt])).logits[0, :-1].float()  # [P-1, V]
    lp = torch.log_softmax(logits, -1)
    return lp.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0], lp.topk(TOP, -1).indices


def _check(out: RequestOutput, hf: Any, prompt: list[int]) -> None:
    lps = out.prompt_logprobs
    assert lps is not None and len(lps) == len(prompt) and lps[0] is None
    chosen, top = _reference(hf, prompt)
    for i, lp in enumerate(lps[1:]):
        assert lp is not None and lp.token_id == prompt[i + 1]
        assert lp.logprob == pytest.approx(float(chosen[i]), abs=1e-4)
        assert [t for t, _ in lp.top] == top[i].tolist()


def _params(prompt_lps: int | None = TOP) -> SamplingParams:
    return SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, prompt_logprobs=prompt_lps)


def test_prompt_logprobs_equal_transformers_in_any_step_layout(tiny_hf_model: Any) -> None:
    folder, hf = tiny_hf_model("llama")
    with _llm(folder) as llm:  # each prompt in one prefill, the three batched
        for out, prompt in zip(llm.generate(PROMPTS, _params()), PROMPTS, strict=True):
            _check(out, hf, prompt)
    with _llm(folder, max_num_batched_tokens=8, max_num_seqs=4) as llm:  # chunked: 8 tokens a step
        outs = llm.generate(PROMPTS, [_params(), _params(None), _params()])
        _check(outs[0], hf, PROMPTS[0])
        assert outs[1].prompt_logprobs is None  # only a request that asks gets them
        _check(outs[2], hf, PROMPTS[2])


def test_a_cached_prompt_is_scored_again_and_others_keep_their_hits(tiny_hf_model: Any) -> None:
    folder, hf = tiny_hf_model("llama")
    prompt = PROMPTS[2]
    with _llm(folder) as llm:
        first = llm.generate([prompt], _params(None))[0]  # fills the prefix cache
        again = llm.generate([prompt], _params())[0]
        _check(again, hf, prompt)
        assert again.outputs[0].cached_tokens == 0  # computed, not read from the cache
        plain = llm.generate([prompt], _params(None))[0]
        assert plain.outputs[0].cached_tokens > 0  # the cache still serves requests without them
        assert again.outputs[0].token_ids == first.outputs[0].token_ids == plain.outputs[0].token_ids


def test_n_choices_report_the_prompt_once_and_a_one_token_prompt_has_none(tiny_hf_model: Any) -> None:
    folder, hf = tiny_hf_model("llama")
    with _llm(folder) as llm:
        out = llm.generate([PROMPTS[1]], _params(), n=3)[0]
        _check(out, hf, PROMPTS[1])
        assert len(out.outputs) == 3
        assert llm.generate([[5]], _params())[0].prompt_logprobs == [None]


def test_scores_survive_a_preemption(tiny_hf_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool of 12 blocks of 8 tokens cannot hold three 35-token prompts growing by 40 tokens:
    the scheduler preempts, and a preempted prompt is recomputed without being scored twice."""
    folder, hf = tiny_hf_model("llama")
    preempted: list[int] = []
    real = Scheduler._preempt

    def spy(self: Scheduler, seq: Any) -> None:
        preempted.append(seq.seq_id)
        real(self, seq)

    monkeypatch.setattr(Scheduler, "_preempt", spy)
    prompts = [PROMPTS[2], PROMPTS[2][::-1], PROMPTS[1] + PROMPTS[0]]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, prompt_logprobs=TOP)
    settings = {
        "model": {"path": str(folder), "kind": "hf", "dtype": "float32"},
        "cache": {"block_size": 8, "num_blocks": 13, "prefix_caching": False},
    }
    with LLM(config_from_dict(settings)) as llm:
        outs = llm.generate(prompts, params)
    assert preempted, "the pool was meant to force a preemption"
    for out, prompt in zip(outs, prompts, strict=True):
        _check(out, hf, prompt)


def test_a_bad_value_names_the_field() -> None:
    for bad in (-1, 21, 1.5):
        with pytest.raises(ValueError, match="prompt_logprobs"):
            SamplingParams(prompt_logprobs=bad)  # type: ignore[arg-type]
