"""LoRA adapters for tests, made with peft over a tiny transformers model and saved in PEFT's format,
and greedy references generated through peft itself."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
NEW = 10  # greedy tokens per request in the comparisons
PROMPTS = [[(7 * i + 3 * k) % 250 + 1 for k in range(3 + (11 * i) % 29)] for i in range(8)]
# the adapters of the `lora_setup` fixture (build_lora_setup): (name, r, alpha, targets (None: all), rsLoRA)
ADAPTERS: list[tuple[str, int, float, list[str] | None, bool]] = [
    ("a1", 8, 16, None, False),
    ("a2", 4, 8, ["q_proj", "v_proj", "down_proj"], False),
    ("a3", 16, 8, ["k_proj", "o_proj", "gate_proj", "up_proj"], True),
]


def lora_cfg(setup: dict[str, Any], **sections: Any) -> Any:
    """A float32 CPU config of the tiny model of `setup` with its adapters (more `lora` keys and
    other sections from `sections`)."""
    from rillet.core.config import config_from_dict

    lora = {"adapters": setup["paths"], **sections.pop("lora", {})}
    model = {
        "path": setup["folder"],
        "kind": "hf",
        "dtype": "float32",
        "device": "cpu",
        **sections.pop("model", {}),
    }
    return config_from_dict({"model": model, "lora": lora, **sections})


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


def build_lora_setup(tiny_hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """{"folder": base model, "paths": name -> adapter folder, "refs": name (None: base) -> tokens
    per prompt of PROMPTS}, the references generated one prompt at a time (no padding)."""
    folder, hf = tiny_hf_model("llama")
    root = tmp_path_factory.mktemp("lora")
    paths: dict[str, str] = {}
    refs: dict[str | None, list[list[int]]] = {None: [greedy(hf, p, NEW) for p in PROMPTS]}
    for i, (name, r, alpha, targets, rslora) in enumerate(ADAPTERS):
        peft_model = make_adapter(
            hf, root / name, r=r, alpha=alpha, targets=targets, seed=i + 1, use_rslora=rslora
        )
        paths[name] = str(root / name)
        refs[name] = [greedy(peft_model, p, NEW) for p in PROMPTS]
    return {"folder": str(folder), "paths": paths, "refs": refs, "hf": hf, "root": root}
