"""The torch custom op through which FlashInferAttentionBackend.forward attends, one op per backend.

The op, opaque to torch.compile, writes the new K/V at slot_mapping and runs the planned wrapper
(the backend's `attend`). It declares no mutated arguments on purpose: the KV cache (2 x layers
tensors) is state the compiler must not functionalize. Measured on the H200 (7B shape,
bench/gpu_profile.py): with the write traced instead, Inductor on CUDA did not re-inplace it and
copied each layer's whole K and V cache every step (12 ms of a 17 ms batch-1 step; on CPU it had
written in place). The write happens inside the op, in stream order, the way vLLM keeps the cache
out of its compiled graph.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Callable
from typing import Protocol

import torch

AttentionOp = Callable[..., torch.Tensor]


class Attends(Protocol):
    """What the op calls: the backend (flashinfer_backend.py, which imports this file)."""

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor: ...


def register_attention_op(backend: Attends) -> AttentionOp:
    """A custom op bound to one backend (a weak reference: the op outlives nothing it owns)."""
    owner = weakref.ref(backend)
    name = f"rillet::flashinfer_attention_{uuid.uuid4().hex[:16]}"

    @torch.library.custom_op(name, mutates_args=())
    def attention(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        be = owner()
        if be is None:
            raise RuntimeError("flashinfer attention op called after its backend was freed")
        return be.attend(q, k, v, k_cache, v_cache, slot_mapping)

    @attention.register_fake
    def _(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        return q.new_empty(q.shape)

    return attention
