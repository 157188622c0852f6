"""Each family from a GGUF file written the way llama.cpp's converter writes it
(tests/support/gguf_export.py): the architecture read from its metadata equals the folder's, and
the engine gives the same greedy tokens from the GGUF as from the folder (which equal
transformers': tests/core/engine/test_families_exact.py). A MoE GGUF whose experts are 4-bit runs
them as int4 experts."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.loaders.gguf import load_gguf
from rillet.core.loaders.hf import load_hf_folder
from rillet.core.model.decoder import DecoderModel
from rillet.core.quant.int4 import Int4Experts
from rillet.core.sampling_params import SamplingParams
from tiny_models.gguf_export import write_gguf

FAMILIES = ["llama", "qwen3", "gemma2", "gemma3_text", "phi3", "mixtral", "qwen3_moe"]
PROMPTS = [[(7 * i + 3 * k) % 250 + 1 for k in range(n)] for i, n in enumerate([3, 17, 9, 30, 20])]
# differences the two sources may have: the GGUF spells the architecture its own way
NEAR_TIE = 0.5  # nats: int4 weights with bf16 activations move these tiny models' logits this much
IGNORED = ("architecture", "bos_token_id", "eos_token_ids", "rope_scaling")


def _tokens(model: dict[str, Any]) -> list[list[int]]:
    cfg = config_from_dict(
        {
            "model": {"dtype": "float32", "max_model_len": 48, **model},
            "cache": {"num_blocks": 12, "block_size": 8},
            "scheduler": {"max_num_batched_tokens": 16, "max_num_seqs": 4},
        }
    )
    with LLM(cfg) as llm:
        params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
        out = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
        llm.engine.core.blocks.check_integrity()
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_gives_the_folders_tokens(tiny_hf_model: Any, tmp_path: Path, family: str) -> None:
    folder, _ = tiny_hf_model(family)
    path = write_gguf(folder, family, tmp_path / f"{family}.gguf")
    from_hf, _ = load_hf_folder(folder)
    from_gguf, _ = load_gguf(path, use_cache=False)
    for f in dataclasses.fields(from_hf):
        a, b = getattr(from_gguf, f.name), getattr(from_hf, f.name)
        if f.name not in IGNORED:  # GGUF metadata floats are float32
            assert a == (pytest.approx(b, rel=1e-6) if isinstance(b, float) else b), f.name
    want = _tokens({"path": str(folder), "kind": "hf"})
    assert _tokens({"path": str(path), "quantization": "none"}) == want


def test_gguf_weights_equal_the_folders(tiny_hf_model: Any, tmp_path: Path) -> None:
    """Gemma 3 (1 + w norms) and Mixtral (permuted q/k, stacked experts) load the same tensors."""
    for family in ("gemma3_text", "mixtral"):
        folder, _ = tiny_hf_model(family)
        path = write_gguf(folder, family, tmp_path / f"{family}.gguf")
        models = []
        for arch, weights in (load_hf_folder(folder), load_gguf(path, use_cache=False)):
            model = DecoderModel(arch, backend=None)  # type: ignore[arg-type]  # never run
            model.load_weights(weights)
            models.append(dict(model.named_parameters()))
        assert models[0].keys() == models[1].keys()
        for name, p in models[0].items():
            assert torch.equal(p, models[1][name]), (family, name)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_four_bit_experts_run_as_int4(tiny_hf_model: Any, tmp_path: Path, family: str) -> None:
    """Q4_0 experts: quantization auto picks int4 and the experts become Int4Experts. Greedy tokens
    follow the same file served with full-precision weights up to the first step where that run's
    two best tokens are within int4's error (NEAR_TIE nats)."""
    folder, _ = tiny_hf_model(family)
    path = write_gguf(folder, family, tmp_path / f"{family}-q4.gguf", quant="Q4_0")
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2)
    cfg = config_from_dict({"model": {"path": str(path), "dtype": "auto", "max_model_len": 48}})
    with LLM(cfg) as llm:
        model = llm.engine.core.runner.model  # type: ignore[attr-defined]
        assert model.int4_weights
        moe = [layer.moe for layer in model.layers if layer.moe is not None]
        assert moe and all(
            isinstance(m.gate_up, Int4Experts) and isinstance(m.down, Int4Experts) for m in moe
        )
        got = llm.generate(PROMPTS, params)
    model_cfg = {"path": str(path), "quantization": "none", "dtype": "float32", "max_model_len": 48}
    with LLM(config_from_dict({"model": model_cfg})) as llm:
        want = llm.generate(PROMPTS, params)
    for g, w in zip(got, want, strict=True):
        logprobs = w.outputs[0].logprobs
        assert logprobs is not None
        for a, b, lp in zip(g.outputs[0].token_ids, w.outputs[0].token_ids, logprobs, strict=True):
            if a != b:
                assert lp.top[0][1] - lp.top[1][1] < NEAR_TIE, (
                    family,
                    g.outputs[0].token_ids,
                    w.outputs[0].token_ids,
                )
                break
