"""The decoder model (DecoderModel, build_model) for every supported family over a flat batch of
tokens (families in arch.py): embedding, the layers (decoder_layer.py), final norm and LM head.

`load_weights` fills the layers' fused parameters from Hugging Face names (weights.py);
`quantize_int4` turns the projections to int4 and the LM head to int8 for CPU decode.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from rillet.core.attention.base import AttentionBackend, StepMetadata
from rillet.core.attention.kv_cache import KVCache as KVCache  # re-exported: attention/kv_cache.py
from rillet.core.attention.kv_cache import allocate_kv_cache as allocate_kv_cache
from rillet.core.loaders.heap import return_free_memory
from rillet.core.lora.stack import LoraStack
from rillet.core.model.arch import ModelArch
from rillet.core.model.decoder_layer import DecoderLayer, empty_param
from rillet.core.model.int4_layers import check_int4_dtype, quantize_layers, streaming_quantizer
from rillet.core.model.rope import RotaryEmbedding, mrope_cos_sin
from rillet.core.model.weights import Target, load_into
from rillet.core.quant.int4 import Int4Weight, Int8Weight, lin
from torch import nn

logger = logging.getLogger(__name__)


class MmEmbeds(NamedTuple):
    """A prefill step's image inputs (core/runner/mm_inputs.py): `embeds` [N, H] replace the token
    embeddings at `rows` [N] of the step; `positions` [3, T]: M-RoPE streams of every token."""

    rows: torch.Tensor | None
    embeds: torch.Tensor | None
    positions: torch.Tensor | None


class DecoderModel(nn.Module):
    def __init__(
        self,
        arch: ModelArch,
        backend: AttentionBackend,
        dtype: torch.dtype = torch.float32,
        max_position: int | None = None,
    ) -> None:
        super().__init__()
        self.arch = arch
        self.backend = backend
        vocab, h = arch.vocab_size, arch.hidden_size
        self.embed_tokens = empty_param((vocab, h), dtype)
        # Gemma: sqrt(hidden) rounded to the model dtype first, as transformers multiplies by it
        self.embed_scale = (
            None if arch.embed_scale is None else float(torch.tensor(arch.embed_scale, dtype=dtype))
        )
        self.layers = nn.ModuleList(DecoderLayer(arch, i, backend, dtype) for i in range(arch.num_layers))
        self.norm = empty_param((h,), dtype)
        self.lm_head = None if arch.tie_word_embeddings else empty_param((vocab, h), dtype)
        self.quant_head: Int8Weight | None = None  # the LM head as int8, set by quantize_int4()
        # LoRA adapters' stacked buffers (attach_lora). Never read by forward, which takes them as
        # an argument: Inductor's weight freezing folds whatever a module holds into constants,
        # and a compiled step would then never see an adapter loaded into a slot.
        self.lora: LoraStack | None = None
        # a vision-language model's image side (core/vision/setup.py VisionModel), set by the loader
        self.vision: Any = None
        # cos/sin are computed in fp32 and stored in the model dtype, as HF casts them to the input's
        positions = max_position or arch.max_position
        self.rope = RotaryEmbedding(
            arch.head_dim,
            positions,
            arch.rope_theta,
            arch.rope_scaling,
            dtype=dtype,
            model_max_position=arch.max_position,
        )
        self.rope_local = None  # Gemma 3's sliding layers: their own base, no scaling
        if arch.uses_local_rope and arch.rope_local_theta is not None:
            self.rope_local = RotaryEmbedding(
                arch.head_dim, positions, arch.rope_local_theta, None, dtype=dtype
            )

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_caches: list[KVCache],  # one per layer
        meta: StepMetadata,
        lora_slots: torch.Tensor | None = None,  # [T] int64 LoRA slot of each token (0: base model)
        lora: LoraStack | None = None,  # the buffers lora_slots index (the model's own: self.lora)
        mm: MmEmbeds | None = None,  # a vision model's prefill: image embeddings, M-RoPE positions
    ) -> torch.Tensor:  # [T, H], after the final norm
        x = F.embedding(input_ids, self.embed_tokens)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        if mm is not None and mm.rows is not None and mm.embeds is not None:
            x = x.index_copy(0, mm.rows, mm.embeds.to(x.dtype))  # images' rows: never scaled
        if mm is not None and mm.positions is not None:
            rope = mrope_cos_sin(self.rope, mm.positions, self.arch.mrope_section)
        else:
            rope = self.rope.cos_sin(positions)
        local = rope if self.rope_local is None else self.rope_local.cos_sin(positions)
        # one mix per step, shared by every layer's LoRA projections
        mix = None if lora is None or lora_slots is None else lora.mix(lora_slots)
        for i, (layer, kv) in enumerate(zip(self.layers, kv_caches, strict=True)):
            layer_lora = lora.layers[i] if lora is not None and mix is not None else None
            x = layer(x, local if layer.local_rope else rope, kv, meta, mix, layer_lora)
        return F.rms_norm(x, self.norm.shape, self.norm, self.arch.rms_norm_eps)

    def attach_lora(self, stack: LoraStack) -> None:
        """Serve LoRA adapters from `stack` (core/lora/stack.py): callers pass it to forward."""
        if len(stack.layers) != len(self.layers):
            raise ValueError(f"LoRA buffers for {len(stack.layers)} layers, the model has {len(self.layers)}")
        self.lora = stack

    @property
    def int4_weights(self) -> bool:
        """The projections are Int4Weight stand-ins (quantize_int4 was called)."""
        return self.quant_head is not None

    @property
    def int4_rows_kernel(self) -> bool:
        """Some projection multiplies through rillet's int4 kernel (core/quant/rows_kernel.py)."""
        return any(m.rows for m in self._int4())

    @property
    def int4_aten_copy(self) -> bool:
        """Those projections keep torch's layout beside (an AMX CPU: Int4Weight)."""
        return any(m.aten_packed is not None for m in self._int4())

    @contextmanager
    def torch_int4_kernel(self) -> Iterator[None]:
        """Within: projections with an aten copy multiply through torch's kernel (the trace of the
        small-batch step; graphs/aot/saved.py)."""
        weights = [m for m in self._int4() if m.aten_packed is not None]
        for m in weights:
            m.use_aten = True
        try:
            yield
        finally:
            for m in weights:
                m.use_aten = False

    def _int4(self) -> list[Int4Weight]:
        return [m for m in self.modules() if isinstance(m, Int4Weight)]

    def head_per_row_block(self, argmax_only: bool = False) -> bool:
        """Whether compute_logits' cost grows with the rows by a pass over the head per block of
        them: torch's int8 kernel is compute-bound past one row. The float head's GEMM and the
        candidate pass of plain greedy rows (oneDNN's int8 GEMM) read their weights once a call
        and cost little more per row (core/runner/verify_rounds.py)."""
        head = self.quant_head
        return head is not None and not (argmax_only and head.candidate_head is not None)

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> [N] long: plain greedy rows' tokens, each row's argmax. The int8 head
        gives the best of its 16 candidates' exact logits (Int8Weight.candidate_tokens; picked by
        its int4 copy for few rows, else by oneDNN's int8 pass), no [N, V] logits: the full
        head's argmax wherever the best token is among them; other heads the argmax of
        compute_logits."""
        if self.quant_head is None:
            return self.compute_logits(hidden).argmax(-1)
        return self.quant_head.candidate_tokens(hidden, cap=self.arch.final_softcap)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] (rows of `forward`'s output) -> float32 logits [N, V]."""
        if self.quant_head is not None:
            logits = self.quant_head.refine(hidden, self.quant_head(hidden).float())
        else:
            head = self.embed_tokens if self.lm_head is None else self.lm_head
            logits = lin(hidden, head).float()
        cap = self.arch.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], int4: bool = False) -> None:
        """Copy Hugging Face-named tensors into the fused parameters (casting dtype/device).
        `int4`: quantize_int4 as the weights come in, each projection once its parts are loaded:
        the float32 model is never whole in memory (peak RSS near the int4 model's).

        Raises ValueError on an unknown name, a shape mismatch, or a parameter left unfilled.
        """
        if int4:
            check_int4_dtype(self.embed_tokens.dtype)
        on_filled = streaming_quantizer(self.layers) if int4 else None
        load_into(self.weight_targets(), weights, self.arch, tied=self.lm_head is None, on_filled=on_filled)
        if int4:
            self.quantize_int4()  # the LM head (and anything not streamed)
            return_free_memory()

    def weight_targets(self) -> dict[str, Target]:
        """Canonical HF name -> (parameter, slice of it, is a norm) for every weight to load."""
        t: dict[str, Target] = {
            "model.embed_tokens.weight": (self.embed_tokens, (), False),
            "model.norm.weight": (self.norm, (), True),
        }
        if self.lm_head is not None:
            t["lm_head.weight"] = (self.lm_head, (), False)
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, DecoderLayer)
            t |= layer.weight_targets(f"model.layers.{i}.", self.arch)
        return t

    def quantize_int4(self) -> None:
        """CPU decode speed: every projection (and expert) to weight-only int4, the LM head to int8
        (an int4 head changed greedy answers, see Int8Weight). The MoE router stays dense.

        After loading. The model's dtype stays the activation dtype: float32 keeps the residual
        stream, norms, RoPE, attention and logits in fp32 (llama.cpp's split). The embedding table
        stays dense (a step reads one row per token); a tied head gets its own int8 copy.
        """
        if self.quant_head is not None:  # done already (load_weights with int4)
            return
        check_int4_dtype(self.embed_tokens.dtype)
        quantize_layers(self.layers)
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        self.quant_head = Int8Weight(head.data)
        if self.lm_head is not None:
            del self.lm_head
            self.lm_head = None

    def init_random(self, seed: int = 0, std: float = 0.02) -> None:
        """Random weights (for "shape" models and benchmarks): N(0, std) matrices, unit norms."""
        gen = torch.Generator(device=self.embed_tokens.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if p.dim() == 1 and "bias" not in name:
                p.data.fill_(1.0)
            else:
                p.data.normal_(0.0, std, generator=gen)


def build_model(
    arch: ModelArch,
    backend: AttentionBackend,
    dtype: torch.dtype,
    device: torch.device | str,
    max_position: int | None = None,
) -> DecoderModel:
    """An uninitialised model on `device` in `dtype`: call `load_weights` or `init_random` next.

    `max_position` caps the RoPE table (default: the model's own max_position_embeddings).
    """
    with torch.device(device):
        return DecoderModel(arch, backend, dtype, max_position).eval()
