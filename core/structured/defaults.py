"""Sampling defaults of a constrained request: a repetition penalty unless it sets a penalty itself.

Under a grammar, a small model's greedy output often loops until max_tokens: the same keys again
(`"releaseDate": …, "releaseDateFormat": …` over and over), digit floods (`1.3448888…`), a string
that never closes. The grammar keeps every token valid JSON, so nothing stops the loop, and the
answer ends cut (finish_reason "length", not parseable). Measured on the default model
(bench/engine/structured_quality.py, 30 JSON tasks, max_tokens 400, eager, this repo's EPYC box):
greedy 22/30 finished and parsed without a penalty, 27/30 with repetition_penalty 1.05, 29/30 with
1.1; at T = 0.7 over three seeds 0.92 with 1.1. So a constrained request that sets none of
repetition_penalty, presence_penalty or frequency_penalty gets `structured.repetition_penalty`
(default 1.1; 1.0 turns it off), like Ollama's default repeat_penalty of 1.1 and vLLM's
generation-config defaults: a server-side default for fields the request left out. A request
that sets any penalty (1.0 included) keeps exactly what it set.
"""

from __future__ import annotations

from collections.abc import Mapping

from rillet.core.structured.spec import GrammarSpec

PENALTY_FIELDS = ("repetition_penalty", "presence_penalty", "frequency_penalty")


def constrained_penalty(
    given: Mapping[str, object], grammar: GrammarSpec | None, default: float
) -> dict[str, float]:
    """The penalty fields to add to a request's sampling fields `given` (those it set): the
    default repetition penalty for a constrained request that set none, else nothing."""
    if grammar is None or default == 1.0 or any(given.get(f) is not None for f in PENALTY_FIELDS):
        return {}
    return {"repetition_penalty": default}
