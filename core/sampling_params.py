"""Per-request sampling and stopping parameters, validated on construction."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rillet.core.errors import RequestError
from rillet.core.structured.spec import GrammarSpec

GREEDY_EPS = 1e-5  # temperatures below this are greedy (dividing by them overflows float32)
MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0  # |bias| bound, as OpenAI's


def _fail(name: str, message: str) -> None:
    raise RequestError(name, message)


@dataclass(frozen=True)
class SamplingParams:
    """OpenAI/vLLM-style knobs. `temperature == 0` means greedy (top-k/p/min-p then do nothing)."""

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0  # > 1 discourages tokens seen in prompt or output (HF/CTRL rule)
    presence_penalty: float = 0.0  # OpenAI: subtract once if the token appeared in the output
    frequency_penalty: float = 0.0  # OpenAI: subtract count * penalty for output occurrences
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None = no logprobs; N >= 0 = sampled token + top-N
    # the prompt's tokens' logprobs (each from the model's raw logits at the position before it)
    # and top-N; None = none. Computed by the prefill, so a request asking for them takes no
    # prefix-cache hits (core/engine/block_manager.py)
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    grammar: GrammarSpec | None = None  # the output must match it (structured outputs, forced tool calls)
    # (token id, bias) pairs, ids ascending and distinct; added to the logits before penalties,
    # grammar masks and sampling. A mapping {id: bias} is accepted and normalised.
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        self._validate()

    def _validate(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            _fail("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            _fail("min_tokens", f"must be an integer in [0, max_tokens], got {self.min_tokens!r}")
        if not 0.0 <= self.temperature <= 100.0:
            _fail("temperature", f"must be in [0, 100], got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            _fail("top_k", f"must be -1, 0 (off) or a positive integer, got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            _fail("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not 0.0 <= self.min_p <= 1.0:
            _fail("min_p", f"must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not -(2**63) <= self.seed < 2**64):
            _fail("seed", f"must be a 64-bit integer, got {self.seed!r}")
        if not 0.0 < self.repetition_penalty <= 10.0:
            _fail("repetition_penalty", f"must be in (0, 10], got {self.repetition_penalty!r}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            _fail("presence_penalty", f"must be in [-2, 2], got {self.presence_penalty!r}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            _fail("frequency_penalty", f"must be in [-2, 2], got {self.frequency_penalty!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            _fail("stop", "every stop sequence must be a non-empty string")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            _fail("stop_token_ids", "every id must be a non-negative integer")
        if self.logprobs is not None and (
            not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            _fail("logprobs", f"must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        if self.prompt_logprobs is not None and (
            not isinstance(self.prompt_logprobs, int) or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS
        ):
            got = self.prompt_logprobs
            _fail("prompt_logprobs", f"must be an integer in [0, {MAX_LOGPROBS}], got {got!r}")
        for token_id, bias in self.logit_bias:
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                _fail("logit_bias", f"bias of token {token_id} must be in [-100, 100], got {bias!r}")
        if self.grammar is not None and self.min_tokens > 0:
            # a finished grammar allows only EOS, which min_tokens bans: no token would be left
            _fail("min_tokens", "cannot be combined with a grammar (response_format or a forced tool call)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def min_tokens_active(self, num_generated: int, eos_token_ids: tuple[int, ...]) -> bool:
        """Before min_tokens outputs, EOS and stop_token_ids are masked (when there are any)."""
        return num_generated < self.min_tokens and bool(eos_token_ids or self.stop_token_ids)

    def greedy_without_logprobs(self) -> bool:
        """The token is the argmax of the final logits (after the grammar mask, bias, penalties and
        the min_tokens mask) and no distribution is returned: a grammar may check that one token
        instead of masking the whole row up front (core/structured/masks.py's lazy rows). The -inf
        of a mask commutes with bias, penalties and the min_tokens mask, so the argmax over the
        allowed tokens is the same in either order."""
        return self.temperature < GREEDY_EPS and self.logprobs is None

    def plain_greedy(self, num_generated: int, eos_token_ids: tuple[int, ...]) -> bool:
        """The token is the argmax of the (grammar-masked) logits and nothing else is read from
        them: greedy, no penalties, no logit bias, no logprobs, no min_tokens mask in force."""
        return (
            self.temperature < GREEDY_EPS
            and not self.has_penalties
            and not self.logit_bias
            and self.logprobs is None
            and not self.min_tokens_active(num_generated, eos_token_ids)
        )


def _bias_pairs(value: object) -> tuple[tuple[int, float], ...]:
    """{id: bias} or (id, bias) pairs -> pairs sorted by id; the ranges are checked by `_validate`."""
    items = value.items() if isinstance(value, Mapping) else value
    if not isinstance(items, Iterable):
        raise RequestError("logit_bias", "must map token ids to numbers")
    pairs: dict[int, float] = {}
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise RequestError("logit_bias", "must map token ids to numbers")
        token_id, bias = item
        if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
            raise RequestError("logit_bias", f"token ids must be non-negative integers, got {token_id!r}")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not math.isfinite(bias):
            raise RequestError("logit_bias", f"bias of token {token_id} must be a number, got {bias!r}")
        if token_id in pairs:
            raise RequestError("logit_bias", f"token {token_id} is given twice")
        pairs[token_id] = float(bias)
    return tuple(sorted(pairs.items()))
