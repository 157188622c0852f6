"""A BERT-family encoder (bert: all-MiniLM, bge, e5, gte-base ...) for embeddings.

Bidirectional attention over whole sequences, so no KV cache and no chunking: a step is a padded
batch [B, S] (right padding) with a key mask, one SDPA per layer. Absolute learned positions,
token type ids (all 0: one segment per input), GELU, post-LayerNorm (LayerNorm after each residual
add). q/k/v are fused into one projection ([Q | K | V] rows), as in the decoder; on CPU the
projections run through oneDNN once `pack()` has reordered their weights (packed_linear.py), the
GELU fused into the up-projection. A batch without padding runs SDPA without a mask (mask None),
as Hugging Face's BertModel does. `forward` returns the last hidden state (what
sentence-transformers pools); BERT's own pooler head is not used.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from rillet.core.model.families import ENCODER_MODEL_TYPES
from rillet.core.model.packed_linear import ACTIVATIONS, Projection
from torch import nn

# weights that are not part of the encoder's forward (BERT's pooler and pre-training heads)
_SKIPPED = ("pooler.", "cls.", "embeddings.position_ids")


@dataclass(frozen=True)
class EncoderArch:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    max_position: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> EncoderArch:
        """From a BERT `config.json`; ValueError for what this encoder does not implement."""
        kind = cfg.get("model_type")
        if kind not in ENCODER_MODEL_TYPES:
            raise ValueError(f"encoder model_type {kind!r} is not supported (one of {ENCODER_MODEL_TYPES})")
        act = str(cfg.get("hidden_act", "gelu"))
        if act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {act!r} is not supported (one of {sorted(ACTIVATIONS)})")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"position_embedding_type {cfg['position_embedding_type']!r} is not supported")
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=int(cfg["num_attention_heads"]),
            max_position=int(cfg.get("max_position_embeddings", 512)),
            type_vocab_size=int(cfg.get("type_vocab_size", 2)),
            layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
            hidden_act=act,
        )


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape), requires_grad=False)


class EncoderLayer(nn.Module):
    def __init__(self, a: EncoderArch) -> None:
        super().__init__()
        h, i = a.hidden_size, a.intermediate_size
        self.n_heads, self.eps = a.num_heads, a.layer_norm_eps
        self.qkv = Projection(h, 3 * h)
        self.o = Projection(h, h)
        self.ln1_weight, self.ln1_bias = _param(h), _param(h)
        self.up = Projection(h, i, a.hidden_act)  # the activation is applied inside
        self.down = Projection(i, h)
        self.ln2_weight, self.ln2_bias = _param(h), _param(h)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:  # x [B, S, H]
        b, s, h = x.shape
        nh = self.n_heads
        qkv = self.qkv(x).view(b, s, 3, nh, h // nh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, nh, S, D] each
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # mask [B, 1, 1, S]: keys
        o = self.o(o.transpose(1, 2).reshape(b, s, h))
        x = F.layer_norm(x + o, (h,), self.ln1_weight, self.ln1_bias, self.eps)
        down = self.down(self.up(x))
        return F.layer_norm(x + down, (h,), self.ln2_weight, self.ln2_bias, self.eps)

    def projections(self) -> tuple[Projection, ...]:
        return self.qkv, self.o, self.up, self.down


class EncoderModel(nn.Module):
    def __init__(self, arch: EncoderArch) -> None:
        super().__init__()
        a = self.arch = arch
        h = a.hidden_size
        self.word = _param(a.vocab_size, h)
        self.position = _param(a.max_position, h)
        self.token_type = _param(a.type_vocab_size, h)
        self.ln_weight, self.ln_bias = _param(h), _param(h)
        self.layers = nn.ModuleList(EncoderLayer(a) for _ in range(a.num_layers))

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, S] int64, right-padded
        mask: torch.Tensor | None,  # [B, S] bool: True on real tokens; None: no padding
    ) -> torch.Tensor:  # [B, S, H]: the last hidden state
        s, h = input_ids.shape[1], self.arch.hidden_size
        # every input is one segment: token type 0 everywhere
        x = F.embedding(input_ids, self.word) + (self.position[:s] + self.token_type[0])
        x = F.layer_norm(x, (h,), self.ln_weight, self.ln_bias, self.arch.layer_norm_eps)
        keys = None if mask is None else mask[:, None, None, :]  # [B, 1, 1, S]
        for layer in self.layers:
            x = layer(x, keys)
        return x

    def pack(self) -> bool:
        """After load_weights: moves every projection to oneDNN where it can (packed_linear.py).
        True when all of them run there."""
        # a list, not a generator: every projection is packed even after one could not be
        return all([p.pack() for layer in self.layers for p in _layer(layer).projections()])

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Hugging Face BERT names (with or without the `bert.` prefix of a task model).

        Raises ValueError on an unknown name, a shape mismatch, or a parameter left unfilled."""
        targets = self._targets()
        loaded: set[str] = set()
        for raw, tensor in weights:
            name = raw.removeprefix("bert.")
            if name.startswith(_SKIPPED):
                continue
            if name not in targets:
                raise ValueError(f"load_weights: unknown weight '{raw}' for a BERT encoder")
            param, rows = targets[name]
            dst = param.data if rows is None else param.data[rows[0] : rows[1]]
            if tuple(dst.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"load_weights: '{raw}' has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}"
                )
            dst.copy_(tensor)
            loaded.add(name)
        missing = sorted(set(targets) - loaded)
        if missing:
            raise ValueError(f"load_weights: missing weights {missing[:5]}")

    def _targets(self) -> dict[str, tuple[nn.Parameter, tuple[int, int] | None]]:
        """HF name -> (parameter, its row range or None for the whole tensor)."""
        h = self.arch.hidden_size
        t: dict[str, tuple[nn.Parameter, tuple[int, int] | None]] = {
            "embeddings.word_embeddings.weight": (self.word, None),
            "embeddings.position_embeddings.weight": (self.position, None),
            "embeddings.token_type_embeddings.weight": (self.token_type, None),
            "embeddings.LayerNorm.weight": (self.ln_weight, None),
            "embeddings.LayerNorm.bias": (self.ln_bias, None),
        }
        for i, module in enumerate(self.layers):
            layer = _layer(module)
            p = f"encoder.layer.{i}."
            for j, proj in enumerate(("query", "key", "value")):
                t[f"{p}attention.self.{proj}.weight"] = (layer.qkv.weight, (j * h, (j + 1) * h))
                t[f"{p}attention.self.{proj}.bias"] = (layer.qkv.bias, (j * h, (j + 1) * h))
            named = {
                "attention.output.dense": (layer.o.weight, layer.o.bias),
                "attention.output.LayerNorm": (layer.ln1_weight, layer.ln1_bias),
                "intermediate.dense": (layer.up.weight, layer.up.bias),
                "output.dense": (layer.down.weight, layer.down.bias),
                "output.LayerNorm": (layer.ln2_weight, layer.ln2_bias),
            }
            for name, (w, b) in named.items():
                t[f"{p}{name}.weight"] = (w, None)
                t[f"{p}{name}.bias"] = (b, None)
        return t


def _layer(module: nn.Module) -> EncoderLayer:
    assert isinstance(module, EncoderLayer)
    return module


def build_encoder(arch: EncoderArch, dtype: torch.dtype, device: torch.device | str) -> EncoderModel:
    """An uninitialised encoder on `device` in `dtype`: call `load_weights` next."""
    with torch.device(device):
        return EncoderModel(arch).to(dtype).eval()
