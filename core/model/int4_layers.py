"""Which of a decoder's weights become weight-only int4, and when (core/quant/int4.py packs them).

Every layer's projections (fused qkv, o, fused gate/up, down) and an MoE layer's stacked experts;
the router, norms and embedding table stay dense. Either all at once after loading
(`quantize_layers`), or each projection as soon as the loader has filled all of its parts
(`streaming_quantizer`), so the float32 model is never whole in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from rillet.core.loaders.heap import return_free_memory
from rillet.core.quant.int4 import quantize_module_weights
from torch import nn

INT4_LAYER = ("qkv_weight", "o_weight", "gate_up_weight", "down_weight")
INT4_EXPERTS = ("gate_up", "down")  # an MoE layer's stacked experts


def check_int4_dtype(dtype: torch.dtype) -> None:
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"int4 weights run in a float32 or bfloat16 model, not {dtype}")


def _parts(layer: nn.Module) -> list[tuple[nn.Module, tuple[str, ...]]]:
    """(module, names of its int4 weights): the layer's own, then its MoE's if it has one."""
    moe = getattr(layer, "moe", None)
    return [(layer, INT4_LAYER)] + ([(moe, INT4_EXPERTS)] if moe is not None else [])


def quantize_layers(layers: Iterable[nn.Module]) -> None:
    for layer in layers:
        for module, names in _parts(layer):
            quantize_module_weights(module, names)


def streaming_quantizer(layers: Iterable[nn.Module]) -> Callable[[nn.Parameter], None]:
    """on_filled for load_into (core/model/weights.py): a filled projection becomes its Int4Weight
    at once; once a layer's are all done, the freed float32 memory goes back to the OS
    (core/loaders/heap.py)."""
    owners: dict[int, tuple[nn.Module, str, int]] = {}  # id(parameter) -> (its module, name, layer)
    left: dict[int, int] = {}  # projections of each layer still float32
    for i, layer in enumerate(layers):
        for module, names in _parts(layer):
            for name in names:
                if getattr(module, name, None) is not None:
                    owners[id(getattr(module, name))] = (module, name, i)
                    left[i] = left.get(i, 0) + 1

    def quantize(param: nn.Parameter) -> None:
        owner = owners.pop(id(param), None)
        if owner is None:
            return
        module, name, i = owner
        quantize_module_weights(module, (name,))
        left[i] -= 1
        if left[i] == 0:
            return_free_memory()

    return quantize
