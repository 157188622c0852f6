"""What an embedding request is, as the engine and the HTTP layer both see it. Torch-free.

A model serves `generate` (chat, completions), `embed` (/v1/embeddings) or both (`model.task`).
An embedding request is a prompt-only sequence: it is scheduled like a prefill (decoders: chunked,
over the paged KV cache; encoders: whole, without KV), and when its last chunk has run the runner
pools the hidden states into one vector instead of sampling a token; the engine then finishes it
(blocks freed, nothing kept) and publishes the vector on the sequence's one delta.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Task = Literal["generate", "embed"]
PoolingMode = Literal["lasttoken", "mean", "cls"]
POOLING_MODES: tuple[PoolingMode, ...] = ("lasttoken", "mean", "cls")


@dataclass(frozen=True, slots=True)
class Pooling:
    """How the model turns a sequence's final hidden states ([S, H]) into one vector ([H])."""

    mode: PoolingMode  # lasttoken: the last token's row; mean: the mean of every row; cls: the first row
    normalize: bool  # unit L2 norm (sentence-transformers' Normalize module)

    @property
    def every_token(self) -> bool:
        """The vector reads every token's hidden state (so a prefix-cache hit, which skips
        computing the cached tokens, cannot serve it)."""
        return self.mode != "lasttoken"


@dataclass(frozen=True, slots=True)
class EmbedParams:
    """One embedding sequence: set on `Seq.embed` (None for generation)."""

    dimensions: int | None = None  # keep the first N components, then renormalize (Matryoshka)
    every_token: bool = False  # Pooling.every_token: no prefix-cache lookup at admission
    whole: bool = False  # an encoder (bidirectional attention): the whole prompt in one step, no KV blocks
