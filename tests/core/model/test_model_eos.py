"""An EOS id of the model's config (config.json's eos_token_id) that the tokenizer does not name:
the sampler bans it under min_tokens as it bans the tokenizer's, so once drawn it must end the
sequence as the tokenizer's EOS does, not stream on past it."""

from __future__ import annotations

from typing import Any

from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams as P
from rillet.core.sequence import FinishReason

PROMPT = [5, 6, 7, 8, 9]


def _greedy(folder: Any, **params: Any) -> tuple[list[int], FinishReason | None]:
    cfg = config_from_dict({"model": {"path": str(folder), "kind": "hf", "dtype": "float32"}})
    with LLM(cfg) as llm:
        out = llm.generate([PROMPT], P(max_tokens=12, temperature=0.0, **params))[0].outputs[0]
    return out.token_ids, out.finish_reason


def test_an_eos_id_of_the_model_config_ends_the_sequence(tiny_hf_model: Any) -> None:
    plain, _ = tiny_hf_model("llama", num_hidden_layers=2)  # eos_token_id None: runs to max_tokens
    tokens, _ = _greedy(plain)
    eos = tokens[2]  # the same weights (same seed), with this id as the config's EOS
    first = tokens.index(eos)
    folder, _ = tiny_hf_model("llama", num_hidden_layers=2, eos_token_id=eos)
    got, reason = _greedy(folder)
    assert (got, reason) == (tokens[: first + 1], FinishReason.STOP)
    # ignore_eos: the same id streams on, as before
    assert _greedy(folder, ignore_eos=True) == (tokens, FinishReason.LENGTH)
