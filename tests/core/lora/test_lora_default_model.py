"""The default model (SmolLM2-135M, its GGUF dequantized to float32) with two LoRA adapters peft made
over transformers' own load of the same file: greedy outputs token for token, each adapter alone
and mixed with base rows in one batch."""

from __future__ import annotations

from typing import Any

import pytest
from harness.hf_gguf import hf_default_model, hf_default_tokenizer
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams
from tiny_models.lora_adapters import greedy, make_adapter

# minutes on one core: its module is queued first under --dist loadfile (tests/conftest.py)
pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
NEW = 12


@pytest.fixture(scope="module")
def refs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tok, hf = hf_default_tokenizer(), hf_default_model()
    prompts = [tok(p).input_ids for p in PROMPTS]
    root = tmp_path_factory.mktemp("lora_default")
    out: dict[str, Any] = {"prompts": prompts, "paths": {}, None: [greedy(hf, p, NEW) for p in prompts]}
    for name, r, targets, seed in (("wide", 8, None, 1), ("attn", 4, ["q_proj", "v_proj", "o_proj"], 2)):
        model = make_adapter(hf, root / name, r=r, alpha=2 * r, targets=targets, seed=seed, std=0.05)
        out["paths"][name] = str(root / name)
        out[name] = [greedy(model, p, NEW) for p in prompts]
    return out


def test_default_model_with_adapters_matches_peft(refs: dict[str, Any]) -> None:
    for name in ("wide", "attn"):
        assert refs[name] != refs[None], name  # the adapters change the answers
    cfg = config_from_dict(
        {
            "model": {"dtype": "float32", "quantization": "none", "device": "cpu"},
            "lora": {"adapters": refs["paths"]},
        }
    )
    prompts: list[list[int]] = refs["prompts"]
    names: list[str | None] = [None, "wide", "attn"]
    params = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    with LLM(cfg) as llm:
        for name in names:
            outs = llm.generate(prompts, params, lora=name)
            assert [o.outputs[0].token_ids for o in outs] == refs[name], name
        batch = [p for p in prompts for _ in names]
        loras = [n for _ in prompts for n in names]
        outs = llm.generate(batch, params, lora=loras)
    want = [refs[n][i // len(names)] for i, n in enumerate(loras)]
    assert [o.outputs[0].token_ids for o in outs] == want
