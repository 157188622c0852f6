"""`speculative`: draft several tokens per step and verify them in one forward of the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rillet.core.config.errors import check

SpecMethod = Literal["off", "ngram", "draft"]
MAX_DRAFT_TOKENS = 16  # k above this never pays: acceptance of the k-th token decays geometrically


@dataclass(frozen=True)
class SpeculativeConfig:
    # off | ngram (prompt lookup: the tokens that followed the sequence's last n tokens earlier in
    # its prompt + output) | draft (a second, smaller model with the same tokenizer)
    method: SpecMethod = "off"
    # k: the most draft tokens per sequence per step. ngram keeps fewer where they do not pay
    # (row_cost); a draft model's adaptive k stays at or below it
    num_tokens: int = 8
    # shortest suffix looked up (ngram). 1: a single matching token is enough; on CPU a refused
    # 1-token draft costs little (a verify row, and no LM head past the first refusal), and
    # grounded answers gain (bench/RESULTS.md, 2026-12-02 evening)
    ngram_min: int = 1
    ngram_max: int = 4  # longest suffix looked up, tried first (ngram)
    # ngram: what one more drafted token costs the verify step, as a fraction of a decode step; a
    # draft token is kept while the chance that it and all before it are accepted is at least
    # this (core/spec/draft_length.py); 0 keeps every proposed token. None: by device, 0.2 on CPU
    # where int4 rows go through AMX tiles or the weights are float (measured with int4 weights,
    # bench/RESULTS.md 2026-12-03), 0.4 on other CPUs with int4 weights (2026-12-05), 0.02 on CUDA
    # (not measured: a memory-bound step's extra query rows cost little)
    row_cost: float | None = None
    draft_model: str | None = None  # draft: a .gguf file or a Hugging Face folder, loaded like model.path
    # draft: its weights' precision, resolved like model.quantization (auto = int4 for a 4-bit GGUF
    # on CPU); it runs in the target's dtype
    draft_quantization: Literal["auto", "none", "int4"] = "auto"
    # no speculation while more sequences than this are running: a plain step is then cheaper than
    # verifying drafts (the batch already fills the matmuls). Measured on CPU (bench/RESULTS.md):
    # at 2 running, drafts pay on grounded answers and cost chat nothing; at 4 they cost 6-9 %
    # on both
    max_batch: int = 2

    def __post_init__(self) -> None:
        check(self.method in ("off", "ngram", "draft"), "speculative.method", "must be off, ngram or draft")
        check(
            1 <= self.num_tokens <= MAX_DRAFT_TOKENS,
            "speculative.num_tokens",
            f"must be in 1..{MAX_DRAFT_TOKENS}, got {self.num_tokens}",
        )
        check(self.ngram_min >= 1, "speculative.ngram_min", f"must be >= 1, got {self.ngram_min}")
        check(
            self.ngram_max >= self.ngram_min,
            "speculative.ngram_max",
            f"must be >= speculative.ngram_min ({self.ngram_min}), got {self.ngram_max}",
        )
        check(self.ngram_max <= 32, "speculative.ngram_max", f"must be <= 32, got {self.ngram_max}")
        check(
            self.row_cost is None or 0.0 <= self.row_cost < 1.0,
            "speculative.row_cost",
            f"must be in [0, 1) or null, got {self.row_cost}",
        )
        check(self.max_batch >= 1, "speculative.max_batch", f"must be >= 1, got {self.max_batch}")
        check(
            self.method != "draft" or bool(self.draft_model),
            "speculative.draft_model",
            "is required when speculative.method is draft (a .gguf file or a Hugging Face folder)",
        )

    @property
    def enabled(self) -> bool:
        return self.method != "off"
