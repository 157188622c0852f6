"""`lora_setup`: a tiny random Llama saved to disk, three adapters peft made for it (different
ranks, alphas and targets, one rsLoRA), and peft's greedy tokens for each, once per session."""

from __future__ import annotations

from typing import Any

import pytest
from lora_helpers import ADAPTERS, NEW, PROMPTS, greedy, make_adapter


@pytest.fixture(scope="session")
def lora_setup(tiny_hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
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
