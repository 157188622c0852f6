"""Rotary position embedding with Hugging Face's `rope_scaling` variants, as one cos/sin table.

Layout is HF Llama's "rotate half": a head vector x = [x1, x2] (halves of D/2) rotates to
[x1*cos - x2*sin, x2*cos + x1*sin], with frequency j shared by x1[j] and x2[j]. The table holds the
half-width cos/sin ([P, D/2]); that is the same arithmetic as HF's `q*cos + rotate_half(q)*sin`
with cos = cat(c, c), so results match it bit for bit in fp32. Like HF, the angles are computed in
fp32 and cast to the model dtype before use.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def _default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    # same expression as transformers (int64 arange, then float), so the fp32 values are identical
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor = float(s["factor"])
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(dim: int, theta: float, s: dict[str, Any], max_pos: int) -> tuple[torch.Tensor, float]:
    orig = int(s.get("original_max_position_embeddings") or max_pos)
    factor = float(s.get("factor") or max_pos / orig)
    attn = s.get("attention_factor")
    if attn is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attn = _yarn_mscale(factor, m) / _yarn_mscale(factor, m_all) if m and m_all else _yarn_mscale(factor)
    beta_fast, beta_slow = float(s.get("beta_fast") or 32), float(s.get("beta_slow") or 1)

    def correction_dim(rot: float) -> float:
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).to(torch.float) / dim)
    extrapolation = 1 - ramp  # 1 = keep the original frequency, 0 = interpolate (divide by factor)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attn)


def _longrope_inv_freq(
    dim: int, theta: float, s: dict[str, Any], max_pos: int, long: bool
) -> tuple[torch.Tensor, float]:
    """Phi-3's LongRoPE: per-frequency divisors (`short_factor` within the original context,
    `long_factor` beyond it) and HF's attention factor."""
    orig = int(s["original_max_position_embeddings"])
    factor = float(s.get("factor") or max_pos / orig)
    attn = s.get("attention_factor")
    if attn is None:
        attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    ext = torch.tensor(s["long_factor" if long else "short_factor"], dtype=torch.float32)
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext * theta**shape), float(attn)


def rope_inv_freq(
    head_dim: int, theta: float, scaling: dict[str, Any] | None, max_position: int
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [D/2] (fp32) and the cos/sin multiplier, per HF's `rope_type`."""
    s = dict(scaling or {})
    kind = str(s.get("rope_type", s.get("type", "default")))
    if s.get("partial_rotary_factor", 1.0) != 1.0:
        raise NotImplementedError("rope: partial_rotary_factor != 1 is not supported")
    inv_freq = _default_inv_freq(head_dim, theta)
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / float(s["factor"]), 1.0
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, s), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(head_dim, theta, s, max_position)
    if kind == "longrope":
        return _longrope_inv_freq(head_dim, theta, s, max_position, long=False)
    if kind == "dynamic":
        # HF's dynamic NTK equals the default rope up to max_position_embeddings and only rescales
        # (per batch, statefully) beyond it; RotaryEmbedding refuses positions past that length.
        return inv_freq, 1.0
    raise NotImplementedError(
        f"rope: rope_type '{kind}' is not supported (default, linear, llama3, yarn, dynamic, longrope)"
    )


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin for positions [0, max_position); `cos_sin(positions)` once per forward."""

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        theta: float,
        scaling: dict[str, Any] | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        model_max_position: int | None = None,
    ) -> None:
        super().__init__()
        model_max = model_max_position or max_position
        kind = str((scaling or {}).get("rope_type", (scaling or {}).get("type", "default")))
        if kind == "dynamic" and max_position > model_max:
            raise NotImplementedError(
                f"rope: dynamic NTK scaling beyond max_position_embeddings ({model_max}) is not supported"
            )
        inv_freq, attn_factor = rope_inv_freq(head_dim, theta, scaling, model_max)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)  # [P, D/2]
        if kind == "longrope":
            # One set of factors for the whole table, chosen by its length, as llama.cpp (by the
            # context size) and vLLM (by max_model_len) do: the long factors when positions past
            # the original context can occur. transformers switches per sequence once it grows
            # past that length and recomputes its cache; a paged cache shared by sequences (and
            # prefixes) keeps one set. Both agree on every sequence when the table fits the
            # original context, and on sequences longer than it otherwise.
            assert scaling is not None
            if max_position > int(scaling["original_max_position_embeddings"]):
                long_inv, _ = _longrope_inv_freq(head_dim, theta, scaling, model_max, long=True)
                freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), long_inv)
        self.head_dim = head_dim
        self.max_position = max_position
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        cos, sin = freqs.cos() * attn_factor, freqs.sin() * attn_factor
        # [P, D] tables laid out for apply_rope: cos repeated, sin negated on the first half
        cos, sin = torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)
        self.register_buffer("cos", cos.to(device=device, dtype=dtype), persistent=False)
        self.register_buffer("sin", sin.to(device=device, dtype=dtype), persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64 -> cos [c | c], sin [-s | s], each [T, 1, D] (broadcast over heads)."""
        cos = self.cos.index_select(0, positions)
        sin = self.sin.index_select(0, positions)
        return cos.unsqueeze(1), sin.unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] (any strides), cos/sin [T, 1, D] from `cos_sin` -> rotated copy [T, H, D].

    [x1 | x2] -> [x1 c - x2 s | x2 c + x1 s], written as x * [c | c] + [x2 | x1] * [-s | s]: the same
    IEEE result (a + (-b) is a - b exactly), in four ops instead of seven, once per layer."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((x2, x1), dim=-1) * sin


def mrope_cos_sin(
    rope: RotaryEmbedding, positions: torch.Tensor, section: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """M-RoPE (Qwen2-VL): positions [3, T] (temporal, height, width streams) -> cos, sin [T, 1, D].

    Frequency j of the half head takes its angle from the stream whose section holds j (sections in
    order, summing to D/2), as transformers' `recomposition_frequencies`: a gather of table entries,
    so a text token (three equal positions) gets exactly ordinary RoPE's cos/sin."""
    half = rope.head_dim // 2
    stream = torch.repeat_interleave(torch.arange(len(section)), torch.tensor(section), output_size=half)
    sel = torch.cat((stream, stream)).to(positions.device)  # [D]
    t = positions.shape[1]
    index = sel.view(1, 1, -1).expand(1, t, -1)
    cos = rope.cos[positions].gather(0, index).squeeze(0)  # [3, T, D] -> [T, D]
    sin = rope.sin[positions].gather(0, index).squeeze(0)
    return cos.unsqueeze(1), sin.unsqueeze(1)
