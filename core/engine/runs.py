"""Landing a step that verified drafts (speculative decoding, core/spec/): a mixin of EngineCore.

Each sequence keeps the longest run of its draft that agrees with the tokens sampled at the same
positions, plus the model's own next token (core/spec/views.py). The run is appended token by
token exactly as a plain step appends its one token (grammar, detokenizer, stop strings, EOS,
max_tokens, the context limit), cut at the first token that ends the sequence, and published as
one delta. Then the refused drafts' K/V slots roll back: num_computed drops to the tokens kept
(the newest one is fed again next step), blocks past them go back to the pool, and the newly full
blocks of kept tokens enter the prefix cache.
"""

from __future__ import annotations

import time

from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.deltas import token_delta
from rillet.core.engine.detokenizer import IncrementalDetokenizer
from rillet.core.outputs import SeqDelta
from rillet.core.runner.base import SampleResult
from rillet.core.sequence import FinishReason, Seq, SeqStatus
from rillet.core.spec.speculator import Speculator
from rillet.core.spec.views import accepted_run


class RunLanding:
    # EngineCore's, read here
    spec: Speculator | None
    blocks: BlockManager
    max_model_len: int
    generated_tokens: int
    _detok: dict[int, IncrementalDetokenizer]

    def _finish(self, seq: Seq, reason: FinishReason) -> None:
        raise NotImplementedError

    def _failed_output(self, seq: Seq, exc: Exception) -> list[SeqDelta]:
        raise NotImplementedError

    def _postprocess_runs(
        self, sampled: list[Seq], result: SampleResult, drafts: dict[int, list[int]]
    ) -> list[SeqDelta]:
        """result rows are per sampled position: 1 + len(draft) consecutive rows per sequence, its
        draft as launched (`drafts`, by seq_id): a sequence aborted while the step ran has had its
        draft_ids cleared since, and its rows must still be skipped, not taken for the next's."""
        deltas: list[SeqDelta] = []
        now = time.monotonic()
        spec = self.spec
        assert spec is not None
        tokens, logprobs = result.token_ids, result.logprobs
        end = 0
        for seq in sampled:
            draft = drafts.get(seq.seq_id, [])
            start, end = end, end + 1 + len(draft)
            seq.draft_ids = []
            if seq.status is SeqStatus.FINISHED:
                continue  # aborted or expired while the step ran
            accepted = accepted_run(draft, tokens[start:end])
            run = tokens[start : start + accepted + 1]
            try:
                text, reason, kept, stop_str = self._add_run(seq, run, now)
            except Exception as exc:
                deltas.extend(self._failed_output(seq, exc))
                continue
            if draft:
                spec.observe(seq, len(draft), accepted)
            lps = logprobs[start : start + kept]
            kept_lps = None if not lps or lps[0] is None else [lp for lp in lps if lp is not None]
            deltas.append(token_delta(seq, run[:kept], text, kept_lps, reason, stop_str))
            if reason is None and draft:  # roll the refused drafts' K/V slots back
                seq.num_computed = min(seq.num_computed, seq.num_tokens - 1)
                self.blocks.truncate(seq, seq.num_tokens)
                self.blocks.commit(seq)
        return deltas

    def _add_run(
        self, seq: Seq, run: list[int], now: float
    ) -> tuple[str, FinishReason | None, int, str | None]:
        """Appends `run` token by token until one ends the sequence: (text, finish, tokens kept,
        the stop string that ended it if one did)."""
        out, detok = seq.output_ids, self._detok[seq.seq_id]
        if seq.first_token_time is None:
            seq.first_token_time = now
        parts: list[str] = []
        reason: FinishReason | None = None
        for token in run:
            out.append(token)
            self.generated_tokens += 1
            if seq.grammar is not None:
                seq.grammar.accept(token)  # raises for a token the grammar refuses: this request fails
            text, reason = detok.add(token, len(out))
            if reason is None and len(seq.prompt_ids) + len(out) >= self.max_model_len:
                reason = FinishReason.LENGTH
                text += detok.flush()
            parts.append(text)
            if reason is not None:
                self._finish(seq, reason)
                break
        return "".join(parts), reason, len(parts), detok.stop_str
