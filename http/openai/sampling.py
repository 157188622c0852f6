"""A request body's sampling fields -> `SamplingParams`, and max_tokens fitted to the context.

Shared by every front end: the chat and completions bodies here, and the Responses and Anthropic
front ends, which hand over a body holding their sampling fields under these names.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rillet.core.errors import RequestError
from rillet.core.sampling_params import SamplingParams
from rillet.core.structured.defaults import constrained_penalty
from rillet.core.structured.spec import GrammarSpec
from rillet.http.openai.errors import ApiError, bad_request
from rillet.http.openai.fields import Body, opt_bool, opt_float, opt_int, opt_int_list, opt_str_list
from rillet.http.openai.logit_bias import parse_logit_bias

FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


def sampling_params(
    body: Body,
    logprobs: int | None,
    grammar: GrammarSpec | None,
    vocab_size: int | None,
    grammar_repetition_penalty: float = 1.0,
) -> SamplingParams:
    """`grammar_repetition_penalty`: what a constrained request that sets no penalty gets
    (core/structured/defaults.py)."""
    kwargs: dict[str, Any] = {name: opt_float(body, name) for name in FLOAT_FIELDS}
    kwargs["top_k"] = opt_int(body, "top_k")
    kwargs["seed"] = opt_int(body, "seed")
    kwargs["min_tokens"] = opt_int(body, "min_tokens", 0)
    kwargs["stop"] = opt_str_list(body, "stop")
    kwargs["stop_token_ids"] = opt_int_list(body, "stop_token_ids")
    kwargs["ignore_eos"] = opt_bool(body, "ignore_eos")
    kwargs["include_stop_str_in_output"] = opt_bool(body, "include_stop_str_in_output")
    kwargs["logprobs"] = logprobs
    kwargs["grammar"] = grammar
    kwargs["logit_bias"] = parse_logit_bias(body.get("logit_bias"), vocab_size)
    given = {k: v for k, v in kwargs.items() if v is not None}
    given.update(constrained_penalty(given, grammar, grammar_repetition_penalty))
    # max_tokens is settled per prompt later; a large placeholder keeps min_tokens checkable now.
    return make_params(dict(given, max_tokens=2**31 - 1))


def make_params(kwargs: dict[str, Any]) -> SamplingParams:
    try:
        return SamplingParams(**kwargs)
    except RequestError as exc:
        raise bad_request(f"'{exc.param}' {exc.message}", param=exc.param) from exc


def fit_context(
    base: SamplingParams,
    prompt_len: int,
    max_tokens: int | None,
    prompt_field: str,
    max_tokens_field: str,
    max_model_len: int,
    default_max_tokens: int,
) -> SamplingParams:
    if prompt_len == 0:
        raise bad_request(f"'{prompt_field}' must contain at least one token", param=prompt_field)
    room = max_model_len - prompt_len
    if room < 1:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{prompt_len} tokens, which leaves no room for a completion",
            param=prompt_field,
            code="context_length_exceeded",
        )
    if max_tokens is not None and max_tokens > room:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens; you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the {prompt_field}, {max_tokens} in the "
            f"completion)",
            param=max_tokens_field,
            code="context_length_exceeded",
        )
    chosen = max_tokens if max_tokens is not None else min(default_max_tokens, room)
    if base.min_tokens > chosen:
        raise bad_request(
            f"'min_tokens' ({base.min_tokens}) exceeds max_tokens ({chosen})", param="min_tokens"
        )
    return dataclasses.replace(base, max_tokens=chosen)
