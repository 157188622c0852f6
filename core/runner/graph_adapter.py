"""The decoder as graphs/ sees it (graphs/interface.py's DecodeModel, VerifyModel and
SavableModel): host planning, then a capturable forward over one decode step; for a saved step,
the same forward over a KV pool given as its input."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import rillet.graphs
import torch
from rillet.core.attention.base import AttentionMetadata, DecodeMetadata, VerifyMetadata
from rillet.core.model.decoder import DecoderModel, KVCache
from rillet.graphs.aot.key import source_digest
from rillet.graphs.frozen import weights_fingerprint
from rillet.graphs.interface import DecodeBatch, GraphKey, VerifyBatch


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

    # ---- saved steps (graphs/interface.py SavableModel) -----------------------------------------
    def step_state(self) -> list[torch.Tensor]:
        """Every layer's pool tensors, flat: k, v (and an int8 pool's two scales), dim 0 = blocks."""
        return [t for c in self.kv_caches for t in _pool_tensors(c)]

    def weights_module(self) -> torch.nn.Module:
        return self.model

    def small_step_gemms(self) -> AbstractContextManager[None]:
        return self.model.torch_int4_kernel()

    def forward_decode_with(self, b: DecodeBatch, state: Sequence[torch.Tensor]) -> torch.Tensor:
        meta = DecodeMetadata(b.slot_mapping, b.seq_lens, b.block_tables)
        return self.model(b.input_ids, b.positions, self._caches(state), meta)

    def forward_verify_with(self, b: VerifyBatch, state: Sequence[torch.Tensor]) -> torch.Tensor:
        meta = VerifyMetadata(b.slot_mapping, b.seq_lens, b.query_lens, b.block_tables)
        return self.model(b.input_ids.reshape(-1), b.positions.reshape(-1), self._caches(state), meta)

    def graph_key(self) -> GraphKey | None:
        """What shapes a saved step's code besides its weights and its pool's block count: the
        architecture, the model's dtype, the attention backend, the pool's per-block layout and
        dtypes (the layout: a config variant), and the source of the code it traces. None when a
        step cannot be saved: a backend that plans on the host, or LoRA buffers (the step reads
        them; saved, they would freeze)."""
        if not self.graph_safe or self.lora is not None:
            return None
        pool = [(str(t.dtype), tuple(t.shape[1:])) for t in _pool_tensors(self.kv_caches[0])]
        parts = [
            self.model.arch.to_json(),
            str(self.model.embed_tokens.dtype),
            self.model.backend.name + self.model.backend.variant,
            repr(pool),
            str(self.block_size),
        ]
        return GraphKey(hashlib.sha256("|".join(parts).encode()).hexdigest()[:20], _source())

    def _caches(self, state: Sequence[torch.Tensor]) -> list[KVCache]:
        per = len(_pool_tensors(self.kv_caches[0]))
        caches = []
        for i in range(0, len(state), per):
            k, v, *scales = state[i : i + per]
            caches.append(KVCache(k, v, (scales[0], scales[1]) if scales else None))
        return caches

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


def _pool_tensors(cache: KVCache) -> list[torch.Tensor]:
    return [cache.k, cache.v, *(cache.scales or ())]


def _source() -> str:
    """A digest of core/ and graphs/: the code a step traces (an edit anywhere there rebuilds;
    ~10 ms, read once per start)."""
    return source_digest([Path(__file__).resolve().parents[1], Path(rillet.graphs.__file__).resolve().parent])
