"""LoRA adapters for tests, made with peft over a tiny transformers model and saved in PEFT's format,
and greedy references generated through peft itself."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(
    base: Any,
    folder: Path,
    *,
    r: int = 8,
    alpha: float = 16,
    targets: list[str] | None = None,
    seed: int = 1,
    std: float = 0.2,
    use_rslora: bool = False,
) -> Any:
    """Saves a LoRA adapter of random A and B (large enough to change greedy outputs) for the HF
    model `base` (left untouched) into `folder`; returns the peft model (eval, float32)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        target_modules=targets or ALL_MODULES,
        lora_dropout=0.0,
        bias="none",
        use_rslora=use_rslora,
        init_lora_weights=False,
    )
    model = get_peft_model(copy.deepcopy(base), config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    model.save_pretrained(str(folder))
    return model.eval()


def greedy(model: Any, prompt: list[int], max_new: int) -> list[int]:
    """transformers' greedy generate() of one prompt (no padding)."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False
        )
    return [int(t) for t in out[0, len(prompt) :]]
