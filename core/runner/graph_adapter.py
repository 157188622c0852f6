"""The decoder as graphs/ sees it (graphs/interface.py's DecodeModel): host planning, then a
capturable forward over one decode step."""

from __future__ import annotations

import itertools

import torch
from rillet.core.attention.base import AttentionMetadata, DecodeMetadata, VerifyMetadata
from rillet.core.model.decoder import DecoderModel, KVCache
from rillet.graphs.frozen import weights_fingerprint
from rillet.graphs.interface import DecodeBatch, VerifyBatch


class DecoderGraphAdapter:
    """The model as graphs/ sees it (graphs/interface.py): host planning, then a capturable forward.

    A backend with `graph_safe_decode` (torch) gets a `DecodeMetadata` built inside the forward
    from the batch's tensors: nothing to plan, no host list in the traced code, so the compiled
    step never guards on (and never recompiles for) a batch's contents. Others (flashinfer) plan
    an `AttentionMetadata` on the host in prepare_decode and read it in the forward."""

    def __init__(self, model: DecoderModel, kv_caches: list[KVCache], block_size: int) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.graph_safe = bool(getattr(model.backend, "graph_safe_decode", False))
        self.meta: AttentionMetadata | None = None
        # LoRA buffers, reached from here (not from the module) so that freezing leaves them inputs
        self.lora = model.lora

    def prepare_decode(self, b: DecodeBatch) -> None:
        if self.graph_safe:
            return
        self.meta = AttentionMetadata(
            b.slot_mapping,
            b.query_start,
            b.seq_lens,
            b.block_tables,
            [1] * b.num_rows,
            b.seq_lens_cpu,
            self.block_size,
            num_prefills=0,
        )
        self.model.backend.begin_step(self.meta)

    def forward_decode(self, b: DecodeBatch) -> torch.Tensor:  # [n, H]
        if self.graph_safe:
            meta: AttentionMetadata | DecodeMetadata = DecodeMetadata(
                b.slot_mapping, b.seq_lens, b.block_tables
            )
        else:
            assert self.meta is not None
            meta = self.meta
        return self.model(b.input_ids, b.positions, self.kv_caches, meta, b.lora_slots, self.lora)

    def weights_key(self) -> str:
        return weights_fingerprint(itertools.chain(self.model.parameters(), self.model.buffers()))

    # ---- speculative verify steps (graphs/interface.py VerifyModel) ---------------------------
    def prepare_verify(self, b: VerifyBatch) -> None:
        if self.graph_safe:
            return
        begin_verify = getattr(self.model.backend, "begin_verify", None)
        if begin_verify is None:
            raise RuntimeError(f"the {self.model.backend.name} attention backend has no verify step")
        begin_verify(b, self.block_size)

    def forward_verify(self, b: VerifyBatch) -> torch.Tensor:  # [n * Q, H]
        meta = VerifyMetadata(b.slot_mapping, b.seq_lens, b.query_lens, b.block_tables)
        return self.model(b.input_ids.reshape(-1), b.positions.reshape(-1), self.kv_caches, meta)
