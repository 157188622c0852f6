"""LoRA adapters through the whole engine against peft, greedy, float32, token for token: a tiny
random Llama with three adapters peft made (different ranks, alphas, targets, one rsLoRA), each
alone, mixed with each other and with base rows in one batch, with fewer slots than adapters (LRU
swapping, requests waiting for a slot), chunked prefill and a preempting pool; the prefix cache
never hits across adapters."""

from __future__ import annotations

from typing import Any

import pytest
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams
from tiny_models.lora_adapters import ADAPTERS, NEW, PROMPTS, lora_cfg


def _run(llm: LLM, prompts: list[list[int]], loras: list[str | None]) -> list[list[int]]:
    params = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params, lora=loras)
    assert all(o.outputs[0].error is None for o in outs)
    return [o.outputs[0].token_ids for o in outs]


def test_adapters_change_the_output(lora_setup: dict[str, Any]) -> None:
    refs = lora_setup["refs"]
    for name, *_ in ADAPTERS:  # random A and B large enough that peft's own answers differ
        assert sum(a != b for a, b in zip(refs[name], refs[None], strict=True)) >= len(PROMPTS) // 2, name


@pytest.mark.parametrize("name", [None, "a1", "a2", "a3"])
def test_each_adapter_alone_matches_peft(lora_setup: dict[str, Any], name: str | None) -> None:
    with LLM(lora_cfg(lora_setup)) as llm:
        assert _run(llm, PROMPTS, [name] * len(PROMPTS)) == lora_setup["refs"][name]
        llm.engine.core.blocks.check_integrity()


@pytest.mark.parametrize(
    "sections",
    [
        pytest.param({}, id="plain"),
        # two slots for three adapters: idle ones are swapped out, requests wait for a slot
        pytest.param({"lora": {"max_loras": 2}}, id="two-slots"),
        pytest.param(
            {
                "scheduler": {"max_num_batched_tokens": 16, "max_num_seqs": 6},
                "cache": {"num_blocks": 14, "block_size": 8},
            },
            id="chunked-preempting",
        ),
    ],
)
def test_mixed_batch_equals_each_alone(lora_setup: dict[str, Any], sections: dict[str, Any]) -> None:
    names: list[str | None] = [None, "a1", "a2", "a3"]
    loras = [names[i % 4] for i in range(len(PROMPTS))] + [names[(i + 1) % 4] for i in range(len(PROMPTS))]
    prompts = PROMPTS + PROMPTS
    with LLM(lora_cfg(lora_setup, **sections)) as llm:
        got = _run(llm, prompts, loras)
        core = llm.engine.core
        core.blocks.check_integrity()
        assert core.blocks.num_used == 0
        slots = core.scheduler.lora_slots
        assert slots is not None and slots.busy() == 0  # every reference given back
        if "lora" in sections:
            assert slots.loads > slots.num_slots  # adapters really were swapped in and out
    want = [lora_setup["refs"][name][i % len(PROMPTS)] for i, name in enumerate(loras)]
    assert got == want


def test_no_prefix_hit_across_adapters(lora_setup: dict[str, Any]) -> None:
    prompt = [(5 * k) % 250 + 1 for k in range(40)]  # 5 full blocks of 8 (block_size below)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    with LLM(lora_cfg(lora_setup, cache={"block_size": 8})) as llm:

        def cached(name: str | None) -> int:
            out = llm.generate([prompt], params, lora=name)[0].outputs[0]
            return out.cached_tokens

        assert cached("a1") == 0
        assert cached("a2") == 0  # the same tokens under another adapter: other K/V
        assert cached(None) == 0  # nor the base model
        assert cached("a1") == 32  # its own blocks are found again (the last token is recomputed)
        assert cached(None) == 32


def test_unknown_adapter_is_refused(lora_setup: dict[str, Any]) -> None:
    from rillet.core.errors import AdapterError, AdapterErrorKind

    with LLM(lora_cfg(lora_setup)) as llm:
        with pytest.raises(AdapterError) as err:
            llm.engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=2), lora="nope")
        assert err.value.kind is AdapterErrorKind.NOT_FOUND


def test_int4_base_weights_with_lora(lora_setup: dict[str, Any]) -> None:
    """int4 projections, the LoRA path in float32 beside them: the adapter still changes the answers
    and a batch mixing adapters equals each alone."""
    cfg = config_from_dict(
        {
            "model": {"path": lora_setup["folder"], "kind": "hf", "quantization": "int4"},
            "lora": {"adapters": lora_setup["paths"]},
        }
    )
    with LLM(cfg) as llm:
        assert llm.engine.runtime.quantization == "int4"
        base = _run(llm, PROMPTS, [None] * len(PROMPTS))
        alone = {name: _run(llm, PROMPTS, [name] * len(PROMPTS)) for name, *_ in ADAPTERS}
        loras = [["a1", "a2", "a3", None][i % 4] for i in range(len(PROMPTS))]
        mixed = _run(llm, PROMPTS, loras)
    for name in alone:
        assert alone[name] != base
    assert mixed == [(alone[n] if n else base)[i] for i, n in enumerate(loras)]
