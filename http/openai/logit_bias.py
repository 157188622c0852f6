"""`logit_bias` (OpenAI: `{"<token id>": bias}`) -> {id: bias}, or a 400 naming the field and the id.

A bias is added to the token's logit before penalties, grammar masks and sampling (the sampler,
core/runner/sampler.py): -100 bans a token in practice, +100 all but forces it. Ids are checked
against the served vocabulary here, so that no request reaches the engine with one it cannot index.
"""

from __future__ import annotations

import math
from typing import Any

from rillet.core.sampling_params import MAX_LOGIT_BIAS
from rillet.http.openai.errors import bad_request
from rillet.http.openai.fields import is_int, type_name

MAX_ENTRIES = 1024  # the sampler walks every entry of every biased row each step


def parse_logit_bias(
    value: Any, vocab_size: int | None, param: str = "logit_bias"
) -> dict[int, float] | None:
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise bad_request(
            f"'{param}' must be an object mapping token ids to numbers, got {type_name(value)}",
            param=param,
            code="invalid_type",
        )
    if len(value) > MAX_ENTRIES:
        raise bad_request(f"'{param}' holds {len(value)} tokens; at most {MAX_ENTRIES}", param=param)
    out: dict[int, float] = {}
    for key, bias in value.items():
        token_id = _token_id(key)
        if token_id is None:
            raise bad_request(f"'{param}' keys must be token ids (integers), got {key!r}", param=param)
        if vocab_size is not None and token_id >= vocab_size:
            raise bad_request(
                f"'{param}' holds token id {token_id}, outside the vocabulary (0..{vocab_size - 1})",
                param=param,
            )
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not math.isfinite(bias):
            raise bad_request(
                f"'{param}' bias of token {token_id} must be a number, got {type_name(bias)}", param=param
            )
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise bad_request(
                f"'{param}' bias of token {token_id} must be in [-100, 100], got {bias}", param=param
            )
        out[token_id] = float(bias)
    return out


def _token_id(key: str) -> int | None:
    """JSON object keys are strings: "42" is token 42 (so is " 42", as int() reads it: not "4.2")."""
    try:
        value = int(key)
    except ValueError:
        return None
    return value if is_int(value) and value >= 0 else None
