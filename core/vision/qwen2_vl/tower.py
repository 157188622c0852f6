"""Qwen2-VL's vision tower: patch embedding (a Conv3d whose stride is its kernel: one matmul over
the flattened patches), ViT blocks with 2-D rotary embeddings (rows and columns, each on a quarter
of the head) and full attention inside each image, then the merger: LayerNorm, each 2x2 block of
patches concatenated, an MLP to the text model's width. Images of a step run as one batch of
patches; attention stays within each image.

Weights under `visual.` (released checkpoints, transformers' save_pretrained) or `model.visual.`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from rillet.core.vision.payload import MmItem

PREFIXES = ("visual.", "model.visual.")


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def _act(name: str) -> Any:
    return {"quick_gelu": _quick_gelu, "gelu": F.gelu, "silu": F.silu}[name]


class QwenVisionTower:
    def __init__(self, vcfg: dict[str, Any], dtype: torch.dtype) -> None:
        self.dim = int(vcfg.get("embed_dim", 1280) if "embed_dim" in vcfg else vcfg.get("hidden_size", 1280))
        self.heads = int(vcfg.get("num_heads", 16))
        self.depth = int(vcfg.get("depth", 32))
        self.merge = int(vcfg.get("spatial_merge_size", 2))
        self.act = _act(str(vcfg.get("hidden_act", "quick_gelu")))
        self.dtype = dtype
        theta = float((vcfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        half = self.dim // self.heads // 2
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, half, 2, dtype=torch.float) / half))
        self.params: dict[str, torch.Tensor] = {}

    # ---- weights ---------------------------------------------------------------------------
    def claims(self, name: str) -> bool:
        return name.startswith(PREFIXES)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, t in weights:
            short = name.split("visual.", 1)[1]
            self.params[short] = t.to(self.dtype).contiguous()
        w = self.params["patch_embed.proj.weight"]
        self.params["patch_embed.proj.weight"] = w.reshape(w.shape[0], -1)
        missing = [n for n in self._expected() if n not in self.params]
        if missing:
            raise ValueError(f"vision tower weights missing: {missing[:4]}")

    def _expected(self) -> list[str]:
        names = [
            "patch_embed.proj.weight",
            "merger.ln_q.weight",
            "merger.mlp.0.weight",
            "merger.mlp.2.weight",
        ]
        return names + [f"blocks.{i}.attn.qkv.weight" for i in range(self.depth)]

    def _w(self, name: str) -> torch.Tensor:
        return self.params[name]

    def _b(self, name: str) -> torch.Tensor | None:
        return self.params.get(name)

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self._w(f"{name}.weight"), self._b(f"{name}.bias"))

    def _ln(self, x: torch.Tensor, name: str) -> torch.Tensor:
        w = self._w(f"{name}.weight")
        return F.layer_norm(x, w.shape, w, self._b(f"{name}.bias"), 1e-6)

    # ---- forward ---------------------------------------------------------------------------
    @torch.inference_mode()
    def encode(self, items: Sequence[MmItem]) -> list[torch.Tensor]:
        """Each image's merged embeddings [item.length, text hidden], one batch for all."""
        pixels = torch.cat([torch.from_numpy(it.pixels) for it in items]).to(self.dtype)
        x = F.linear(pixels, self._w("patch_embed.proj.weight"))  # [N, dim]
        cos, sin = self._rope(items)
        lens = [it.grid[0] * it.grid[1] * it.grid[2] for it in items]
        x = self._blocks(x, cos, sin, lens, items)
        return self._merge(x).split([n // self.merge**2 for n in lens])

    def _blocks(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lens: list[int], items: Sequence[MmItem]
    ) -> torch.Tensor:
        for i in range(self.depth):
            x = self._block(x, f"blocks.{i}.", cos, sin, lens)
        return x

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return self._ln(x, name)

    def _mlp(self, h: torch.Tensor, p: str) -> torch.Tensor:
        return self._linear(self.act(self._linear(h, f"{p}mlp.fc1")), f"{p}mlp.fc2")

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        x = self._norm(x, "merger.ln_q").reshape(-1, self.dim * self.merge**2)
        return self._linear(F.gelu(self._linear(x, "merger.mlp.0")), "merger.mlp.2")

    def _rope(self, items: Sequence[MmItem]) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [N, 1, head_dim] (fp32): rows then columns of each patch, in merge-block order."""
        pos = torch.cat([self._patch_positions(it.grid) for it in items])  # [N, 2]
        freqs = (pos[..., None].float() * self.inv_freq).flatten(1)  # [N, head_dim / 2]
        emb = torch.cat((freqs, freqs), -1)
        return emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)

    def _patch_positions(self, grid: tuple[int, ...]) -> torch.Tensor:
        t, h, w = grid
        m = self.merge
        hpos = torch.arange(h).unsqueeze(1).expand(h, w).reshape(h // m, m, w // m, m)
        wpos = torch.arange(w).unsqueeze(0).expand(h, w).reshape(h // m, m, w // m, m)
        hw = torch.stack((hpos.transpose(1, 2).flatten(), wpos.transpose(1, 2).flatten()), -1)
        return hw.repeat(t, 1)

    def _block(
        self, x: torch.Tensor, p: str, cos: torch.Tensor, sin: torch.Tensor, lens: list[int]
    ) -> torch.Tensor:
        x = x + self._attention(self._norm(x, f"{p}norm1"), p, cos, sin, lens)
        return x + self._mlp(self._norm(x, f"{p}norm2"), p)

    def _attention(
        self, x: torch.Tensor, p: str, cos: torch.Tensor, sin: torch.Tensor, lens: list[int]
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self._linear(x, f"{p}attn.qkv").reshape(n, 3, self.heads, -1).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        outs = [
            F.scaled_dot_product_attention(qi.transpose(0, 1), ki.transpose(0, 1), vi.transpose(0, 1))
            for qi, ki, vi in zip(q.split(lens), k.split(lens), v.split(lens), strict=True)
        ]
        o = torch.cat([o.transpose(0, 1) for o in outs]).reshape(n, self.dim)
        return self._linear(o, f"{p}attn.proj")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb_vision: in fp32, back to x's dtype."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), -1) * sin).to(x.dtype)
