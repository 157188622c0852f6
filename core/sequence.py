"""One sequence's state as the scheduler and engine see it.

Counters, all in tokens:
  prompt_len          fixed at creation
  len(output_ids)     sampled so far
  num_tokens          prompt_len + len(output_ids): every token the sequence holds
  num_computed        tokens whose K/V are written in the cache (prefix hits included)
  num_cached          of the prompt, tokens reused from the prefix cache at the last admission
  num_pending         sampled on the device, not yet seen by the host (overlap: <= engine.overlap_depth)
  num_scheduled_tokens  num_tokens + num_pending: the length the scheduler plans with
  len(draft_ids)      speculative decoding: tokens proposed for this step, fed after the last one
                      and verified by the step's forward (core/spec/); never part of num_tokens
Invariant while RUNNING: num_computed <= num_scheduled_tokens and the block table covers
num_computed tokens (plus the slots being written this step). With overlap, num_computed may pass
num_tokens by the pending tokens: their K/V are written by the steps in flight, their ids are on the device.
Preemption frees the blocks and resets num_computed to 0: the sequence recomputes prompt + output
so far, so its output continues exactly where it stopped.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rillet.core.embedding import EmbedParams
from rillet.core.errors import ErrorKind
from rillet.core.sampling_params import SamplingParams
from rillet.core.structured.matcher import GrammarMatcher

if TYPE_CHECKING:  # torch-free at run time: the HTTP layer imports this module
    from rillet.core.lora.adapter import LoraAdapter
    from rillet.core.vision.payload import MmPayload


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"  # EOS, stop token or stop string
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"  # client went away / cancelled
    ERROR = "error"  # this request failed; others go on


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), best first


@dataclass(eq=False)
class Seq:
    seq_id: int
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: FinishReason | None = None
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached: int = 0
    num_preemptions: int = 0
    num_pending: int = 0
    first_token_time: float | None = None
    scheduled_time: float | None = None  # first admitted by the scheduler (monotonic), for tracing
    deadline: float | None = None  # monotonic time after which the request is cut off
    error: str | None = None  # with FinishReason.ERROR: what happened, for logs and messages
    error_kind: ErrorKind | None = None  # ... and its kind, which callers act on
    index: int = 0  # choice index within its request (n > 1)
    priority: int = 0  # scheduler.policy priority: lower runs first (core/engine/scheduling/priority.py)
    leader: Seq | None = None  # choice 0 of the request; later choices wait for its prefill
    grammar: GrammarMatcher | None = None  # constrained output: has consumed output_ids (matcher.py)
    # An embedding request (core/embedding.py): prompt only, pooled instead of sampled, never decodes.
    # Its params say max_tokens 1, so the scheduler's pending-token rule keeps it from being
    # scheduled again once its last chunk is in flight (the pooled vector is that "token").
    embed: EmbedParams | None = None
    # speculative decoding: this step's draft (set before scheduling, cleared once the step lands)
    draft_ids: list[int] = field(default_factory=list)
    # LoRA (core/lora/): the request's adapter (None: the base model) and, while RUNNING, the slot
    # of the stacked buffers it holds a reference on (0: the base model's)
    lora: LoraAdapter | None = None
    lora_slot: int = 0
    # params.prompt_logprobs (choice 0 only: its siblings share the prompt): the logprobs of prompt
    # tokens 1.. as the prefill computes them; complete at len(prompt_ids) - 1 entries
    prompt_lps: list[TokenLogprob] | None = None
    # a vision model's images (core/vision/payload.py): encoded at prefill, their hashes in the
    # prefix cache's block keys; None for a text prompt
    mm: MmPayload | None = None

    @property
    def rope_delta(self) -> int:
        """What RoPE adds to a position past the prompt (M-RoPE: images take fewer positions)."""
        return 0 if self.mm is None else self.mm.rope_delta

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def wants_prompt_lps(self) -> bool:
        """Prompt logprobs asked for and not all computed: its prefill must not skip cached blocks."""
        return self.prompt_lps is not None and len(self.prompt_lps) < len(self.prompt_ids) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_scheduled_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids) + self.num_pending

    @property
    def num_generated(self) -> int:
        """Output tokens sampled so far, the pending one included."""
        return len(self.output_ids) + self.num_pending

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    @property
    def in_prefill(self) -> bool:
        """True until every token but the newest has K/V in the cache (the newest is fed next)."""
        return self.num_computed < self.num_scheduled_tokens - 1

    def token_at(self, i: int) -> int:
        p = len(self.prompt_ids)
        return self.prompt_ids[i] if i < p else self.output_ids[i - p]

    def tokens(self, start: int, end: int) -> list[int]:
        p = len(self.prompt_ids)
        if end <= p:
            return self.prompt_ids[start:end]
        if start >= p:
            return self.output_ids[start - p : end - p]
        return self.prompt_ids[start:] + self.output_ids[: end - p]

    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids
