"""Qwen2.5-VL's vision tower: Qwen2-VL's (tower.py) with RMSNorms, a gated SiLU MLP with biases,
and window attention: patches are reordered window by window (windows of `window_size` pixels,
in merge blocks), most blocks attend within a window and `fullatt_block_indexes` across the image;
the merger's output goes back to raster order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from rillet.core.vision.payload import MmItem
from rillet.core.vision.qwen2_vl.tower import QwenVisionTower


class Qwen25VisionTower(QwenVisionTower):
    def __init__(self, vcfg: dict[str, Any], dtype: torch.dtype) -> None:
        super().__init__({**vcfg, "hidden_act": vcfg.get("hidden_act", "silu")}, dtype)
        self.window = int(vcfg.get("window_size", 112))
        self.patch = int(vcfg.get("patch_size", 14))
        self.full_blocks = {int(i) for i in vcfg.get("fullatt_block_indexes") or ()}
        self._reverse = torch.empty(0, dtype=torch.long)  # this batch's window order, undone

    def _expected(self) -> list[str]:
        names = [
            "patch_embed.proj.weight",
            "merger.ln_q.weight",
            "merger.mlp.0.weight",
            "merger.mlp.2.weight",
        ]
        return names + [f"blocks.{i}.mlp.gate_proj.weight" for i in range(self.depth)]

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        w = self._w(f"{name}.weight")
        return F.rms_norm(x.float(), w.shape, w.float(), 1e-6).to(x.dtype)

    def _mlp(self, h: torch.Tensor, p: str) -> torch.Tensor:
        gate = self.act(self._linear(h, f"{p}mlp.gate_proj"))
        return self._linear(gate * self._linear(h, f"{p}mlp.up_proj"), f"{p}mlp.down_proj")

    def _blocks(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lens: list[int], items: Sequence[MmItem]
    ) -> torch.Tensor:
        order, windows = self._window_order(items)
        unit = self.merge**2
        n = x.shape[0]
        x = x.reshape(n // unit, unit, -1)[order].reshape(n, -1)
        cos = cos.reshape(n // unit, unit, -1)[order].reshape(n, 1, -1)
        sin = sin.reshape(n // unit, unit, -1)[order].reshape(n, 1, -1)
        for i in range(self.depth):
            x = self._block(x, f"blocks.{i}.", cos, sin, lens if i in self.full_blocks else windows)
        self._reverse = torch.argsort(order)
        return x

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        return super()._merge(x)[self._reverse]

    def _window_order(self, items: Sequence[MmItem]) -> tuple[torch.Tensor, list[int]]:
        """transformers' get_vision_window_index: merge blocks window by window, and the windows'
        lengths in patches."""
        size = self.window // self.merge // self.patch
        order: list[torch.Tensor] = []
        windows: list[int] = []
        base = 0
        for it in items:
            t, h, w = it.grid
            gh, gw = h // self.merge, w // self.merge
            index = torch.arange(t * gh * gw).reshape(t, gh, gw)
            ph, pw = size - gh % size, size - gw % size
            padded = F.pad(index, (0, pw, 0, ph), "constant", -100)
            nh, nw = (gh + ph) // size, (gw + pw) // size
            padded = (
                padded.reshape(t, nh, size, nw, size).permute(0, 1, 3, 2, 4).reshape(t, nh * nw, size, size)
            )
            counts = (padded != -100).sum([2, 3]).reshape(-1)
            flat = padded.reshape(-1)
            order.append(flat[flat != -100] + base)
            windows += [int(c) * self.merge**2 for c in counts if c > 0]
            base += t * gh * gw
        return torch.cat(order), windows
