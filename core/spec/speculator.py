"""What the engine calls for speculative decoding, once per step: propose drafts before the
scheduler plans the step, observe each verified sequence once the step has landed.

A sequence drafts in a step when it is decoding (its last token is the only one without K/V, none
in flight), the running batch is at most `speculative.max_batch`, and its draft length policy
(draft_length.py: by the matched suffix for the n-gram lookup, adaptive k for a draft model) lets
it. Its draft is cut so that the step can never go past max_tokens or the context limit
(k <= tokens it may still produce - 1), after the first token that would end it (EOS unless
ignore_eos, a stop token id), and at the first token its grammar refuses (structured outputs:
llguidance checks the draft against the matcher's state without advancing it). The scheduler then
plans 1 + len(draft) tokens for it (scheduler.py), dropping the draft rather than preempting.
Plain Python: a drafter that runs a model does so behind the Drafter interface.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rillet.core.config.speculative import SpeculativeConfig
from rillet.core.sequence import Seq
from rillet.core.spec.adaptive import AdaptiveK
from rillet.core.spec.draft_length import ByMatch, DraftLength, resolve_row_cost
from rillet.core.spec.drafter import Drafter

log = logging.getLogger(__name__)


@dataclass
class SpecStats:
    """Counters since start (the /metrics endpoint reads them)."""

    drafted: int = 0  # draft tokens sent to verification
    accepted: int = 0  # of those, accepted
    verified: int = 0  # sequence-steps that verified a draft (each also gains the model's own token)
    steps: int = 0  # engine steps with at least one draft


class Speculator:
    def __init__(
        self,
        cfg: SpeculativeConfig,
        drafter: Drafter,
        max_model_len: int,
        eos: tuple[int, ...],
        device_type: str = "cpu",
        rows_cheap: bool = True,
    ) -> None:
        self.cfg = cfg
        # the default row_cost (draft_length.py): by device, and on CPU by the int4 kernel's path
        self.row_cost = resolve_row_cost(cfg.row_cost, device_type, rows_cheap)
        self.drafter = drafter
        self.max_model_len = max_model_len
        self.eos = frozenset(eos)
        self.stats = SpecStats()
        self._lengths: dict[int, DraftLength] = {}  # seq_id -> its draft length policy
        self._drafted: list[Seq] = []  # sequences holding a draft from the last propose()

    def active(self, num_running: int) -> bool:
        """Whether this step may speculate (then the step before it must have landed)."""
        return 0 < num_running <= self.cfg.max_batch

    def propose(self, running: list[Seq]) -> None:
        """Sets `draft_ids` of the running sequences that speculate this step (clears the rest)."""
        self.clear()
        if not self.active(len(running)):
            return
        seqs: list[Seq] = []
        ks: list[int] = []
        for seq in running:
            k = self._room(seq)
            if k > 0:
                seqs.append(seq)
                ks.append(k)
        if not seqs:
            return
        drafts = self.drafter.propose(seqs, ks)
        any_draft = False
        for seq, k, proposal in zip(seqs, ks, drafts, strict=True):
            keep = self._lengths[seq.seq_id].keep(proposal._replace(tokens=proposal.tokens[:k]), len(running))
            draft = self._cut(seq, proposal.tokens[:keep])
            if draft:
                seq.draft_ids = draft
                self._drafted.append(seq)
                any_draft = True
        self.stats.steps += any_draft

    def clear(self) -> None:
        for seq in self._drafted:
            seq.draft_ids = []
        self._drafted = []

    def _new_length(self) -> DraftLength:
        if self.drafter.cheap:
            return ByMatch(self.cfg.num_tokens, self.row_cost)
        return AdaptiveK(self.cfg.num_tokens)

    def _room(self, seq: Seq) -> int:
        """Tokens seq may draft this step (0: it does not speculate)."""
        out = len(seq.output_ids)
        if seq.num_pending or seq.num_computed != len(seq.prompt_ids) + out - 1 or seq.is_finished:
            return 0  # in prefill, or a token in flight
        length = self._lengths.get(seq.seq_id)
        if length is None:
            length = self._lengths[seq.seq_id] = self._new_length()
        k = length.next_k()
        # the step yields at most k + 1 tokens: never past max_tokens or the context limit
        return min(k, seq.params.max_tokens - out - 1, self.max_model_len - seq.num_tokens - 1)

    def _cut(self, seq: Seq, draft: list[int]) -> list[int]:
        p = seq.params
        stops = p.stop_token_ids if p.ignore_eos else (*self.eos, *p.stop_token_ids)
        for i, t in enumerate(draft):
            if t in stops:
                draft = draft[: i + 1]  # the sequence ends there if it is accepted
                break
        g = seq.grammar
        if g is not None and draft:
            if g.failed or g.consumed != len(seq.output_ids):
                return []
            draft = draft[: g.matcher.validate_tokens(draft)]
        return draft

    def observe(self, seq: Seq, drafted: int, accepted: int) -> None:
        """seq's draft of `drafted` tokens was verified; the first `accepted` were kept."""
        st = self.stats
        st.drafted += drafted
        st.accepted += accepted
        st.verified += 1
        length = self._lengths.get(seq.seq_id)
        if length is not None:
            length.observe(drafted, accepted)
        if not seq.is_finished:
            self.drafter.landed(seq)

    def release(self, seq: Seq) -> None:
        """seq finished (or was preempted: its drafter state is rebuilt when it runs again)."""
        seq.draft_ids = []
        if seq.is_finished:
            self._lengths.pop(seq.seq_id, None)
        self.drafter.release(seq)

    def close(self) -> None:
        self.drafter.close()
