"""`lora.dtype`: the stacked buffers in bfloat16 beside int4 or bfloat16 base weights (whose matmuls
take bfloat16 operands already), float32 beside float32 weights; a bfloat16 delta is the float32
one of bfloat16-rounded operands, accumulated in float32, with the slot scales applied in float32."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rillet.core.attention.torch_backend import TorchAttentionBackend
from rillet.core.config import ConfigError, load_config
from rillet.core.llm import LLM
from rillet.core.lora.adapter import LoraAdapter, module_shapes
from rillet.core.lora.setup import lora_dtype
from rillet.core.lora.stack import LoraStack
from rillet.core.model.decoder import DecoderModel, build_model
from rillet.core.model.shapes import shape_arch
from tiny_models.lora_adapters import ALL_MODULES, lora_cfg

CPU = torch.device("cpu")


def _model(dtype: torch.dtype, int4: bool) -> DecoderModel:
    model = build_model(shape_arch("tiny"), TorchAttentionBackend(), dtype, "cpu")
    model.init_random(seed=1, std=0.05)
    if int4:
        model.quantize_int4()
    return model


@pytest.mark.parametrize(
    ("setting", "dtype", "int4", "want"),
    [
        ("auto", torch.float32, False, torch.float32),  # float32 operands: the peft tests' case
        ("auto", torch.float32, True, torch.bfloat16),  # int4 casts its operands to bfloat16
        ("auto", torch.bfloat16, False, torch.bfloat16),
        ("float32", torch.float32, True, torch.float32),
        ("bfloat16", torch.float32, False, torch.bfloat16),
    ],
)
def test_auto_follows_the_base_matmuls_operands(
    setting: str, dtype: torch.dtype, int4: bool, want: torch.dtype
) -> None:
    assert lora_dtype(setting, _model(dtype, int4)) == want


def test_a_bad_dtype_names_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, ["lora.dtype=float16"])
    assert err.value.key == "lora.dtype"


def test_the_engine_allocates_the_resolved_dtype(lora_setup: dict[str, Any]) -> None:
    for model, want in (({}, torch.float32), ({"quantization": "int4"}, torch.bfloat16)):
        with LLM(lora_cfg(lora_setup, model=model)) as llm:
            stack = llm.engine.core.runner.model.lora
            assert stack is not None and stack.dtype == want
            layer = stack.layers[0].qkv
            assert layer is not None and layer.a.dtype == want and layer.b[0].dtype == want


def _adapter(arch: Any, uid: int, r: int) -> LoraAdapter:
    gen = torch.Generator().manual_seed(uid)
    weights = {
        where: (torch.randn(r, d_in, generator=gen) * 0.3, torch.randn(d_out, r, generator=gen) * 0.3)
        for where, (d_in, d_out) in module_shapes(arch).items()
    }
    return LoraAdapter(f"a{uid}", "-", uid, r, 1.5 + uid, weights)


def test_bfloat16_delta_is_the_float32_delta_of_rounded_operands() -> None:
    arch = shape_arch("tiny")
    dtypes = (torch.float32, torch.bfloat16)
    stacks = {dt: LoraStack(arch, 3, 8, frozenset(ALL_MODULES), CPU, dt) for dt in dtypes}
    for stack in stacks.values():
        stack.write(1, _adapter(arch, 1, 8))
        stack.write(3, _adapter(arch, 3, 4))
    slots = torch.tensor([1, 0, 3, 1, 3])  # [T]: two adapters and a base row
    x = torch.randn(5, arch.hidden_size)
    proj16, proj32 = stacks[torch.bfloat16].layers[0].qkv, stacks[torch.float32].layers[0].qkv
    assert proj16 is not None and proj32 is not None
    got = proj16.delta(x, stacks[torch.bfloat16].mix(slots))  # [T, out] bfloat16
    assert got.dtype == torch.bfloat16
    # the same math in float32 over the operands rounded to bfloat16
    rounded = x.bfloat16().float()
    s = rounded @ proj16.a.float().t()  # [T, P * L * R]
    s = (s.bfloat16().float().view(5, 3, -1) * stacks[torch.float32].mix(slots)[:, None]).bfloat16().float()
    want = torch.cat([s[:, p] @ b.float() for p, b in enumerate(proj16.b)], dim=-1)
    torch.testing.assert_close(got.float(), want, rtol=2**-7, atol=1e-3)
    assert torch.equal(got[1], torch.zeros_like(got[1]))  # the base row: no delta
    full = proj32.delta(x, stacks[torch.float32].mix(slots))  # and near the float32 buffers' delta
    assert (got.float() - full).abs().max() <= 0.02 * full.abs().max()
