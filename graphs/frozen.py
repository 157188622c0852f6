"""Frozen weights for the CPU max-autotune modes, and the cache key that freezing needs.

Inductor's CPU GEMM templates take only weights it may treat as constants (`freezing`). Its
FX-graph cache keys a frozen parameter by its metadata alone (shape, dtype, stride), not by its
values, and on AMX machines the weight-only int4 template packs the weights at compile time into
constants of the compiled module, which the cache entry stores: a second model of the same shapes
(a fine-tune, another seed) then hit the first one's entry and computed with the first one's
weights (seen on a Xeon with AMX: 188 of 192 logits off by up to 4.0). On AVX-512 without AMX the
template reads the weights by name and the hit was harmless. So every frozen compile carries a
fingerprint of the weights in its key: a no-op post-grad pass whose uuid is that fingerprint
(Inductor folds a custom pass's uuid into the key; that is its documented purpose).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass


class _WeightsKey(CustomGraphPass):
    """Changes nothing in the graph; only its uuid counts (see the module docstring)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, graph: torch.fx.graph.Graph) -> None:
        return None

    def uuid(self) -> Any:
        return f"rillet-frozen-weights-{self.key}"


def weights_fingerprint(tensors: Iterable[torch.Tensor]) -> str:
    """A digest of the tensors' dtypes, shapes and bytes, in order (~0.1 s per 100 MB here)."""
    digest = hashlib.blake2b(digest_size=16)
    for t in tensors:
        digest.update(f"{t.dtype}{tuple(t.shape)}".encode())
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy().data)
    return digest.hexdigest()


@contextmanager
def frozen_weights(weights_key: str | None) -> Iterator[None]:
    """Inductor's `freezing` for the compile that runs inside, keyed by `weights_key` (None: no
    freezing). Dynamo reads `freezing` while it traces, on the tracing thread (Inductor's config
    overrides are per thread), to turn the parameters into constants; torch.compile(options=...)
    reaches Inductor but not that tracing (seen: nothing froze). Frozen parameters stay the
    module's own tensors (freezing_discard_parameters is off): the eager path keeps using them."""
    if weights_key is None:
        yield
        return
    import torch._inductor.config as inductor_config

    with inductor_config.patch(freezing=True, post_grad_custom_post_pass=_WeightsKey(weights_key)):
        yield
