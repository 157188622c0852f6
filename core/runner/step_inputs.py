"""A step's model inputs (`StepInputs`) and the token layout they follow.

Built each step by input_builder.py from persistent device state (persistent_batch.py); read by
the model runner, speculative decoding (core/spec/), pooling and tensor parallelism
(core/distributed/), none of which needs the builder: hence apart from it.

Token layout of a step (T tokens, B sequences): rows that do not end in a sampled single-token
decode (prefill chunks) first, then the decodes, each sequence's new tokens contiguous. Seq b
feeds tokens [num_computed, num_computed + num_new) of its prompt + output (+ pending token); it
samples only when that chunk reaches the end.

Speculative decoding: a verify row (a sequence with a draft, core/spec/) feeds its last token and
its k draft tokens, and samples at each of those 1 + k tokens: its sample rows are consecutive,
`sample_seqs` names the sequence once per row and `sample_offsets` gives each row's position in
the run (0..k; None when the step verifies nothing). A verify row is laid out as a prefill chunk
(its queries attend causally to each other over the paged cache).

LoRA: each sequence's slot in the adapters' stacked buffers (core/lora/stack.py; 0 = the base
model) travels per token as `lora_slots`, only when some row of the step has an adapter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from rillet.core.attention.base import AttentionMetadata
from rillet.core.engine.scheduler import ScheduledBatch
from rillet.core.sequence import Seq


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [S] int64: row of T whose hidden state gives each sampled logit
    sample_seqs: list[Seq]  # [S]
    sample_slots: torch.Tensor  # [S] int64: persistent row of each sampled sequence
    future_at: torch.Tensor | None = None  # [F] int64: input_ids entries the future buffer feeds
    future_rows: torch.Tensor | None = None  # [F] int64: ... from these rows
    pool: list[PoolRows] = field(default_factory=list)  # embedding chunks: pooled, never sampled
    sample_offsets: list[int] | None = None  # [S] position of each sample row in its verify run
    verify_only: bool = False  # verify rows and decodes only: every token samples (graph verify step)
    lora_slots: torch.Tensor | None = None  # [T] int64 LoRA slot per token; None: every row is base
    prompt_lps: list[PromptRows] = field(default_factory=list)  # chunks that owe prompt logprobs


@dataclass(slots=True)
class PoolRows:
    """One embedding sequence's chunk in a step: tokens [first, first + count) of the step's T."""

    seq: Seq
    first: int
    count: int
    start: int  # the position of the chunk's first token (0: the chunk opens the sequence)
    last: bool  # the chunk ends the prompt: the vector is ready after this step


@dataclass(slots=True)
class PromptRows:
    """A prefill chunk's rows whose logits score prompt tokens (params.prompt_logprobs): token
    `first + i` of the step's T is at position `start + i` and predicts `targets[i]`, the prompt
    token after it."""

    seq: Seq
    first: int
    start: int
    targets: list[int]


def order_batch(batch: ScheduledBatch) -> list[tuple[Seq, int]]:
    """Prefill chunks first, then decodes (one new token that is sampled); stable in each group."""
    chunks, decodes = split_batch(batch)
    return chunks + [(seq, 1) for seq in decodes]


def split_batch(batch: ScheduledBatch) -> tuple[list[tuple[Seq, int]], list[Seq]]:
    """(prefill chunks with their new-token counts, decodes), each in batch order."""
    chunks: list[tuple[Seq, int]] = []
    decodes: list[Seq] = []
    for seq, n in zip(batch.seqs, batch.num_new, strict=True):
        # a decode: one new token, which reaches the end (prompt + outputs + the pending one);
        # a one-token embedding prompt is a chunk: it is pooled, not sampled
        n_all = len(seq.prompt_ids) + len(seq.output_ids) + seq.num_pending
        if n == 1 and seq.num_computed + 1 == n_all and seq.embed is None:
            decodes.append(seq)
        else:
            chunks.append((seq, n))
    return chunks, decodes
