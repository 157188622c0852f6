"""What graphs/ sees of a model: one decode step over a batch of rows (and a speculative verify
step, Q query tokens per row), and the padding convention.

graphs/ never imports rillet.core; the core side adapts its model to `DecodeModel` (usually a few
lines around its model forward and its attention backend's `begin_step`).

A decode step has one new token per sequence, so every per-row tensor has the batch as its first
axis and `query_start` is simply 0, 1, ..., n. Padding rows (added to reach a captured batch size)
must never touch real state:
  - token id 0 at position 0, writing its K/V to slot 0, inside block 0: the reserved dummy
    block that no sequence owns (see core/attention/base.py);
  - context length 1 (just that dummy slot) over a block table of zeros;
  - adapter slot 0 (the base model: no LoRA delta).
So a padding row attends to one dummy key, stays finite, and its output row is thrown away.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import torch

PAD_TOKEN_ID = 0
PAD_POSITION = 0
PAD_SLOT = 0  # slot 0 = block 0, offset 0: the reserved dummy block
PAD_BLOCK = 0
PAD_SEQ_LEN = 1  # position 0 + 1: the padding row's own (dummy) token is its whole context
PAD_LORA_SLOT = 0  # no adapter


@dataclass(frozen=True)
class DecodeBatch:
    """n rows of one decode step, all tensors on the model's device (or copied there by `fill`)."""

    input_ids: torch.Tensor  # [n] int64
    positions: torch.Tensor  # [n] int64
    slot_mapping: torch.Tensor  # [n] int64: flat KV slot each row's new K/V goes to
    seq_lens: torch.Tensor  # [n] int32: context length after this step (position + 1)
    block_tables: torch.Tensor  # [n, W] int32, unused columns 0
    query_start: torch.Tensor  # [n + 1] int32: 0, 1, ..., n
    seq_lens_cpu: list[int]  # [n] host copy of seq_lens, for host-side planning only
    # [n] int64: each row's adapter slot (LoRA: the model's stacked adapter buffers; 0 = none).
    # The static buffers always hold one (padding rows: 0), so a graph never sees it appear.
    lora_slots: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return len(self.seq_lens_cpu)


@dataclass(frozen=True)
class VerifyBatch:
    """n rows of a speculative verify step, Q query tokens each (the row's last token and its
    drafts, padded to Q): query i of row r sits at position seq_lens[r] - query_lens[r] + i and
    attends causally over the row's paged context. Padding queries (i >= query_lens[r]) take token
    0 at position 0 into slot 0; padding rows are decode padding rows with query_lens 1."""

    input_ids: torch.Tensor  # [n, Q] int64
    positions: torch.Tensor  # [n, Q] int64
    slot_mapping: torch.Tensor  # [n, Q] int64
    seq_lens: torch.Tensor  # [n] int32: context length after this step
    query_lens: torch.Tensor  # [n] int32: real queries of each row (1..Q)
    block_tables: torch.Tensor  # [n, W] int32, unused columns 0
    seq_lens_cpu: list[int]  # [n] host copies, for host-side planning only
    query_lens_cpu: list[int]

    @property
    def num_rows(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_queries(self) -> int:  # Q
        return int(self.input_ids.shape[1])


class DecodeModel(Protocol):
    """The model side of a graphed decode step.

    `prepare_decode` runs on the host before every forward, eager or replayed, and never inside
    a graph: it is where per-step host work goes (flashinfer's plan()). It may depend on the
    batch's host data (`seq_lens_cpu`) and on its row count.

    `forward_decode` must be capturable: no host syncs, no shapes that depend on tensor values.
    It reads the batch's tensors and fixed model state (weights, KV cache) and returns one output
    row per input row ([n, ...]). It is compiled with the row dimension dynamic (one compile for
    all buckets), so it must not turn the row count or `seq_lens_cpu` into Python values (a list of
    n items, a branch): host-side needs belong to `prepare_decode`, which may leave state (e.g. the
    step's attention metadata over the same tensors) for `forward_decode` to use.
    """

    def prepare_decode(self, batch: DecodeBatch) -> None: ...

    def forward_decode(self, batch: DecodeBatch) -> torch.Tensor: ...

    def weights_key(self) -> str:
        """A fingerprint of the weights the forward reads (graphs/frozen.py: frozen compiles key
        Inductor's cache by it). Called on the compile thread, only when the weights are frozen."""
        ...


class VerifyModel(Protocol):
    """The model side of a graphed speculative verify step: as DecodeModel, over a VerifyBatch;
    `forward_verify` returns n * Q output rows, row r's queries at [r * Q, (r + 1) * Q)."""

    def prepare_verify(self, batch: VerifyBatch) -> None: ...

    def forward_verify(self, batch: VerifyBatch) -> torch.Tensor: ...


@dataclass(frozen=True)
class GraphKey:
    """What shapes a saved step besides its weights (graphs/aot/key.py): `layout`, what the config
    decides (architecture, dtypes, attention backend, the KV pool's block layout); `code`, a digest
    of the source it traces. A new `code` replaces the old step; another `layout` is a variant."""

    layout: str
    code: str


class SavableModel(Protocol):
    """A model whose compiled steps can be saved to disk and loaded by a later process
    (graphs/aot/): the steps are exported with every tensor they write or that varies with the
    config (the KV pool) as an input, never read from the model, so that one saved step serves
    any pool size, and with only the weights inside.

    `step_state` is that list: each tensor's first dimension is the pool's block count (the
    exported step takes it as a symbol), the other dimensions fixed by the model. The
    `*_with` forwards are DecodeModel's and VerifyModel's over it. `weights_module` holds every
    parameter and buffer the forwards read (they become constants of the compiled code).
    `graph_key` describes what else shapes the traced code (a GraphKey), or is None when this
    model cannot be saved (e.g. LoRA buffers, which a step reads but a saved one would freeze)."""

    def step_state(self) -> list[torch.Tensor]: ...

    def weights_module(self) -> torch.nn.Module: ...

    def small_step_gemms(self) -> AbstractContextManager[None]:
        """Within: the forwards multiply as the small-batch step should (graphs/aot/saved.py
        DECODE_SMALL); a model with one way of multiplying changes nothing."""
        ...

    def forward_decode_with(self, batch: DecodeBatch, state: Sequence[torch.Tensor]) -> torch.Tensor: ...

    def forward_verify_with(self, batch: VerifyBatch, state: Sequence[torch.Tensor]) -> torch.Tensor: ...

    def graph_key(self) -> GraphKey | None: ...

    def weights_key(self) -> str: ...


class GraphSettings(Protocol):
    """The graph options graphs/ reads (core's GraphConfig has exactly these)."""

    @property
    def enabled(self) -> str: ...  # "auto" | "on" | "off"

    @property
    def buckets(self) -> tuple[int, ...]: ...  # () = the default ladder

    @property
    def compile_mode(self) -> str: ...  # "auto" | "none" | torch.compile mode

    @property
    def small_batch(self) -> int | str: ...  # rows up to which the saved small-batch step runs, or auto
