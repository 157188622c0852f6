"""Gemma 3's image encoder: the SigLIP vision transformer (patch embedding, learned positions,
pre-norm encoder layers with full attention, a final LayerNorm), then the multimodal projector
(average pooling of the patch grid to `mm_tokens_per_image`, Gemma's RMSNorm with (1 + w), one
projection into the text model's hidden size).

Module names follow transformers' (weights.py maps every checkpoint layout onto them). Images are
independent: a batch of N images is one [N, 3, S, S] forward."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from rillet.core.vision.gemma3.config import Gemma3VisionArch
from torch import nn


class SiglipAttention(nn.Module):
    def __init__(self, a: Gemma3VisionArch) -> None:
        super().__init__()
        h = a.hidden_size
        self.heads = a.num_heads
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.out_proj = nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, P, H] -> [N, P, H]
        n, p, h = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(n, p, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        o = F.scaled_dot_product_attention(q, k, v)  # every patch sees every patch of its image
        return self.out_proj(o.transpose(1, 2).reshape(n, p, h))


class SiglipMLP(nn.Module):
    def __init__(self, a: Gemma3VisionArch) -> None:
        super().__init__()
        self.fc1 = nn.Linear(a.hidden_size, a.intermediate_size)
        self.fc2 = nn.Linear(a.intermediate_size, a.hidden_size)
        self.approximate = "tanh" if a.hidden_act == "gelu_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class SiglipLayer(nn.Module):
    def __init__(self, a: Gemma3VisionArch) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(a.hidden_size, eps=a.layer_norm_eps)
        self.self_attn = SiglipAttention(a)
        self.layer_norm2 = nn.LayerNorm(a.hidden_size, eps=a.layer_norm_eps)
        self.mlp = SiglipMLP(a)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEmbeddings(nn.Module):
    def __init__(self, a: Gemma3VisionArch) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(a.num_channels, a.hidden_size, a.patch_size, stride=a.patch_size)
        self.position_embedding = nn.Embedding(a.patches_per_side**2, a.hidden_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:  # [N, C, S, S] -> [N, P, H]
        x = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        return x + self.position_embedding.weight[None]


class SiglipEncoder(nn.Module):
    def __init__(self, a: Gemma3VisionArch) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SiglipLayer(a) for _ in range(a.num_layers))


class SiglipVisionModel(nn.Module):
    def __init__(self, a: Gemma3VisionArch) -> None:
        super().__init__()
        self.embeddings = SiglipEmbeddings(a)
        self.encoder = SiglipEncoder(a)
        self.post_layernorm = nn.LayerNorm(a.hidden_size, eps=a.layer_norm_eps)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:  # [N, C, S, S] -> [N, P, H]
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)


class Gemma3Projector(nn.Module):
    def __init__(self, a: Gemma3VisionArch) -> None:
        super().__init__()
        self.arch = a
        self.mm_soft_emb_norm = nn.Module()
        self.mm_soft_emb_norm.weight = nn.Parameter(torch.zeros(a.hidden_size))
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(a.hidden_size, a.text_hidden_size))

    def forward(self, patches: torch.Tensor) -> torch.Tensor:  # [N, P, Hv] -> [N, mm_tokens, Ht]
        n, _, h = patches.shape
        side = self.arch.patches_per_side
        grid = patches.transpose(1, 2).reshape(n, h, side, side)
        pooled = F.avg_pool2d(grid, self.arch.pool_kernel).flatten(2).transpose(1, 2)
        w = self.mm_soft_emb_norm.weight
        assert isinstance(w, torch.Tensor)
        # Gemma's RMSNorm: float32 throughout, times (1 + w), back to the input's dtype
        x = pooled.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.arch.layer_norm_eps)
        normed = (x * (1.0 + w.float())).to(pooled.dtype)
        return torch.matmul(normed, self.mm_input_projection_weight).to(patches.dtype)


class Gemma3VisionEncoder(nn.Module):
    """pixels [N, C, S, S] -> image embeddings [N, mm_tokens_per_image, text hidden size]."""

    def __init__(self, a: Gemma3VisionArch) -> None:
        super().__init__()
        self.arch = a
        self.vision_model = SiglipVisionModel(a)
        self.multi_modal_projector = Gemma3Projector(a)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.multi_modal_projector(self.vision_model(pixels))
