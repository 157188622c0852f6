"""A sampled sequence's delta: what both landing paths (landing.py, one token; runs.py, an accepted
run of drafts) publish for it, so the two can differ only in which tokens they carry."""

from __future__ import annotations

from rillet.core.outputs import SeqDelta
from rillet.core.sequence import FinishReason, Seq, TokenLogprob


def token_delta(
    seq: Seq,
    tokens: list[int],  # the step's new tokens, already appended to seq.output_ids
    text: str,
    logprobs: list[TokenLogprob] | None,
    reason: FinishReason | None,
    stop_str: str | None,  # the detokenizer's: the stop string that ended seq, if one did
) -> SeqDelta:
    """The delta of `tokens`: with the finish and the stop string that caused it, and, where it
    carries the sequence's first output token, the prompt's logprobs (params.prompt_logprobs)."""
    delta = SeqDelta(
        seq.request_id,
        seq.index,
        tokens,
        text,
        logprobs,
        reason,
        len(seq.prompt_ids),
        seq.num_cached,
        len(seq.output_ids),
        seq.error,
        seq.error_kind,
        None if reason is None else stop_str,
    )
    if reason is not None:
        delta.scheduled_at = seq.scheduled_time
    if seq.prompt_lps is not None and len(seq.output_ids) == len(tokens):
        delta.prompt_logprobs = seq.prompt_lps
    return delta
