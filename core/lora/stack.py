"""The adapters' weights on the device: fixed stacked buffers, `max_loras` slots x `max_rank`.

Slot 0 is the base model (no adapter); adapters sit in slots 1..L. For each fused projection of a
layer (qkv, o, gate_up, down) the buffers are
  a  [P * L * R, in]   the shrink: part p (q, k, v / gate, up), slot s at rows
                       p * L * R + (s - 1) * R + [0, r)
  b  P x [L * R, out_p] the expand, B^T of each part
and one step computes, for its T tokens with slot index `slots` [T]:
  mix   [T, L * R]  scale of the token's slot on that slot's R columns, 0 elsewhere
  delta = ((x A^T) * mix) B^T  -> y += delta beside the base projection (shrink, then expand)
          (the columns where mix is 0 are selected out, so no slot's inf or NaN reaches another row)
which is BGMV's y += scale (x A[idx]) B[idx] as two dense matmuls over every slot's columns:
gathering A[idx] per token would copy T * R * in floats (a 2k-token prefill of a 7B model: GBs),
while the masked form costs 2 * L * R * (in + out) multiply-adds a token in BLAS, with shapes that
never depend on which adapters are loaded. Loading writes a slot's rows in place: the compiled
step and CUDA graphs read the same tensors, so nothing recompiles. Ranks below R leave zero rows.
The buffers' dtype is `lora.dtype` (setup.py): bfloat16 beside int4 or bfloat16 base weights,
whose matmuls take bfloat16 operands already (half the bytes a step reads: with every slot of 4
rank-16 adapters on all seven projections, more than the int4 weights themselves), float32 beside
float32 weights. The matmuls accumulate in float32 either way; the slot scales multiply the
shrink's output in float32, and the delta is added in the residual's dtype. The buffers live on a
plain object, not as module parameters: Inductor's weight freezing (max-autotune modes) would fold
parameters into constants and never see a load.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from rillet.core.errors import AdapterError, AdapterErrorKind
from rillet.core.lora.adapter import LoraAdapter, Module
from rillet.core.model.arch import ModelArch

# fused projection -> its parts in output order (decoder_layer.py fuses q/k/v and gate/up the same way)
FUSED = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}


class ProjectionLora:
    """One fused projection's buffers in one layer (only the parts in the stack's targets)."""

    def __init__(
        self,
        widths: dict[str, int],
        d_in: int,
        targets: frozenset[str],
        slots: int,
        rank: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.parts = [(m, w, m in targets) for m, w in widths.items()]  # (module, out width, held)
        held = [m for m, _, on in self.parts if on]
        self.index = {m: p for p, m in enumerate(held)}  # module -> its part in a and b
        self.cols = slots * rank
        self.a = torch.zeros(len(held) * self.cols, d_in, dtype=dtype, device=device)
        self.b = [torch.zeros(self.cols, w, dtype=dtype, device=device) for m, w, on in self.parts if on]

    def delta(self, x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:  # x [T, in] -> [T, out]
        dtype = self.a.dtype
        s = F.linear(x.to(dtype), self.a).view(-1, len(self.b), self.cols)  # [T, P, L*R]
        m = mix[:, None, :]
        # the slot scales, in float32; other slots' columns are selected out, not multiplied by 0: an
        # adapter whose x A overflows to inf must not turn every other row of the batch into NaN
        s = torch.where(m != 0, s.float() * m, 0.0).to(dtype)
        outs = []
        for module, width, held in self.parts:
            if held:
                outs.append(s[:, self.index[module]] @ self.b[self.index[module]])  # [T, out_p]
            else:  # a part no adapter may target: nothing to add
                outs.append(s.new_zeros(s.shape[0], width))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def write(
        self, module: str, first: int, a: torch.Tensor | None, b: torch.Tensor | None, rank: int
    ) -> None:
        """Rows [first, first + rank) of `module`'s part: zeroed, then A [r, in] and B [out, r]."""
        p = self.index[module]
        top = p * self.cols + first  # the slot's first row in a
        self.a[top : top + rank].zero_()
        self.b[p][first : first + rank].zero_()
        if a is not None and b is not None:
            self.a[top : top + a.shape[0]].copy_(a)
            self.b[p][first : first + b.shape[1]].copy_(b.t())


class LayerLora:
    """One decoder layer's LoRA buffers; a projection no target reaches is None (no work)."""

    def __init__(self, projections: dict[str, ProjectionLora | None]) -> None:
        self.qkv = projections.get("qkv")
        self.o = projections.get("o")
        self.gate_up = projections.get("gate_up")
        self.down = projections.get("down")
        self.by_module = {
            m: p for name, p in projections.items() if p is not None for m in FUSED[name] if m in p.index
        }


class LoraStack:
    """Every layer's buffers, the slots' scales, and the per-step mix (see the module docstring)."""

    def __init__(
        self,
        arch: ModelArch,
        slots: int,
        rank: int,
        targets: frozenset[str],
        device: torch.device,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.slots, self.rank, self.targets, self.dtype = slots, rank, targets, dtype
        h, i = arch.hidden_size, arch.intermediate_size
        q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
        self.layers: list[LayerLora] = []
        for layer in range(arch.num_layers):
            widths: dict[str, tuple[dict[str, int], int]] = {
                "qkv": ({"q_proj": q, "k_proj": kv, "v_proj": kv}, h),
                "o": ({"o_proj": h}, q),
            }
            if not arch.is_moe_layer(layer):
                widths |= {"gate_up": ({"gate_proj": i, "up_proj": i}, h), "down": ({"down_proj": h}, i)}
            projections = {
                name: ProjectionLora(w, d_in, targets, slots, rank, device, dtype)
                if targets & set(w)
                else None
                for name, (w, d_in) in widths.items()
            }
            self.layers.append(LayerLora(projections))
        # slot of each of the L * R columns (1..L, R each), and each slot's scale (slot 0: none)
        self.col_slot = torch.arange(1, slots + 1, device=device).repeat_interleave(rank)  # [L*R] int64
        self.scales = torch.zeros(slots + 1, dtype=torch.float32, device=device)  # [L + 1]

    def mix(self, slots: torch.Tensor) -> torch.Tensor:  # slots [T] int64 -> [T, L * R] float32
        return (slots[:, None] == self.col_slot[None, :]).float() * self.scales.index_select(0, slots)[
            :, None
        ]

    def check(self, adapter: LoraAdapter) -> None:
        """Raises AdapterError if the adapter does not fit these buffers."""
        if adapter.rank > self.rank:
            raise AdapterError(
                AdapterErrorKind.INVALID,
                adapter.name,
                f"LoRA adapter '{adapter.name}': r = {adapter.rank} is above lora.max_rank ({self.rank})",
            )
        for layer, module in adapter.weights:
            if module not in self.layers[layer].by_module:
                raise AdapterError(
                    AdapterErrorKind.INVALID,
                    adapter.name,
                    f"LoRA adapter '{adapter.name}' targets {module} (layer {layer}), which "
                    f"lora.target_modules leaves out (held: {', '.join(sorted(self.targets))})",
                )

    def write(self, slot: int, adapter: LoraAdapter | None) -> None:
        """Puts `adapter` in `slot` (None: empties it), every row of the slot rewritten."""
        assert 1 <= slot <= self.slots, f"slot {slot} outside 1..{self.slots}"
        first = (slot - 1) * self.rank
        weights: dict[Module, tuple[torch.Tensor, torch.Tensor]] = adapter.weights if adapter else {}
        for layer, lora in enumerate(self.layers):
            for module, proj in lora.by_module.items():
                a, b = weights.get((layer, module), (None, None))
                proj.write(module, first, a, b, self.rank)
        self.scales[slot] = adapter.scale if adapter is not None else 0.0

    @property
    def slot_bytes(self) -> int:
        """Device bytes one slot takes in the buffers (what an adapter costs resident)."""
        total = 0
        for lora in self.layers:
            for p in (lora.qkv, lora.o, lora.gate_up, lora.down):
                if p is not None:
                    total += p.a.nbytes + sum(b.nbytes for b in p.b)
        return total // self.slots
