"""Weight-only int4 for CPU decode: lossless on Q4_1-style groups, an exact-top-k int8 head, config checks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rillet.core.config import ConfigError, config_from_dict
from rillet.core.llm import LLM
from rillet.core.quant.int4 import GROUP, Int4Weight, Int8Weight, int4_supported, lin
from rillet.core.quant.select import resolve_dtype
from rillet.core.sampling_params import SamplingParams

pytestmark = [
    pytest.mark.isa,  # run again under an AVX2 cap (tests/test_isa_cap.py)
    pytest.mark.skipif(not int4_supported(), reason="no CPU int4 kernel in this torch"),
]


def q4_1_like(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Weights as a Q4_1 file stores them: per 32-group, x = q * d + min with q = 0 and 15 present."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // GROUP, 1, generator=g) * 0.01 + 0.001).bfloat16().float()
    lo = (torch.randn(n, k // GROUP, 1, generator=g) * 0.05).bfloat16().float()
    q = torch.randint(0, 16, (n, k // GROUP, GROUP), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15
    return (q * d + lo).reshape(n, k)


def test_int4_is_lossless_on_q4_1_groups() -> None:
    w = q4_1_like(96, 128)
    x = torch.randn(3, 128).bfloat16()
    want = x.float() @ w.t()
    got = Int4Weight(w)(x).float()
    # only bf16 activations/accumulation separate them; a wrong code would be off by d * |x|
    assert torch.allclose(got, want, atol=2e-2, rtol=2e-2)


def test_int8_head_is_within_a_quarter_step_per_weight() -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(256, 64, generator=g) * 0.05
    x = torch.randn(2, 64, generator=g).bfloat16()
    head = Int8Weight(w)
    want = x.float() @ w.t()
    step = w.abs().amax(1) / 127  # [N]: one int8 step per row
    bound = (0.5 * step[None, :] + 0.01 * w.abs().amax(1)[None, :]) * x.float().abs().sum(1, keepdim=True)
    assert ((head(x).float() - want).abs() <= bound + 2e-2).all()
    assert torch.allclose(lin(x, head).float(), head(x).float())


def test_lin_dispatches_and_adds_bias() -> None:
    w = q4_1_like(64, 64, seed=1)
    b = torch.randn(64).bfloat16()
    x = torch.randn(2, 64).bfloat16()
    assert torch.allclose(
        lin(x, Int4Weight(w), b).float(), (x.float() @ w.t() + b.float()), atol=2e-2, rtol=2e-2
    )
    assert torch.equal(lin(x.float(), w), x.float() @ w.t())


def test_rejects_input_dim_not_multiple_of_group() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        Int4Weight(torch.randn(8, 40))


def test_config_checks_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"model\.dtype"):
        resolve_dtype("float16", torch.device("cpu"), "int4")
    with pytest.raises(ConfigError, match=r"model\.quantization"):
        resolve_dtype("auto", torch.device("cuda"), "int4")
    # int4 weights in a float32 model by default: only the matmul operands are bf16
    assert resolve_dtype("auto", torch.device("cpu"), "int4") == torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu"), "int4") == torch.bfloat16


def q8_0_like(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Weights as Q8_0 stores them: per 32-group, x = c * d, c in [-127, 127], |c| = 127 present."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // GROUP, 1, generator=g) * 0.001 + 1e-4).half().float()
    c = torch.randint(-127, 128, (n, k // GROUP, GROUP), generator=g).float()
    c[..., 0] = 127
    return (c * d).reshape(n, k)


def test_int8_head_refines_its_top_logits_to_float32() -> None:
    w = q8_0_like(512, 96)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(5))
    head = Int8Weight(w)
    approx = head(x).float()
    got = head.refine(x, approx, k=8)
    exact = x.double() @ w.double().t()  # [3, 512]
    top = approx.topk(8, dim=-1).indices
    # the refined candidates are the float32 logits of the Q8_0 weights, the rest are untouched
    torch.testing.assert_close(got.gather(1, top).double(), exact.gather(1, top), rtol=1e-6, atol=1e-6)
    rest = torch.ones_like(got, dtype=torch.bool).scatter(1, top, False)
    assert torch.equal(got[rest], approx[rest])
    assert torch.equal(got.argmax(-1), exact.argmax(-1))


def test_int8_head_rows_past_a_whole_block_run_apart_with_the_same_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More rows than a block of 4 and not a multiple of it: the whole blocks and the rest are two
    kernel calls (the rest would cost a whole pass riding along), and every row's logits are the
    bits one call gives: the kernel computes each row alone."""
    w = q8_0_like(512, 96)
    head = Int8Weight(w)
    real = torch.ops.aten._weight_int8pack_mm
    calls: list[int] = []

    def spy(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return real(x, codes, scales)

    x = torch.randn(13, 96, generator=torch.Generator().manual_seed(6))
    single = real(x.to(torch.bfloat16), head.row_codes, head.row_scales)
    monkeypatch.setattr(torch.ops.aten, "_weight_int8pack_mm", spy)
    for m in range(1, 14):
        calls.clear()
        got = head(x[:m])
        assert torch.equal(got, single[:m])
        assert calls == ([m] if m <= 4 or m % 4 == 0 else [m - m % 4, m % 4])


def test_float32_activations_round_only_the_operands() -> None:
    w = q4_1_like(64, 64, seed=2)
    b = torch.randn(64)
    x = torch.randn(2, 64)
    y = lin(x, Int4Weight(w), b)
    assert y.dtype == torch.float32  # bf16 matmul output widened by the fp32 bias add
    want = x.bfloat16().float() @ w.t() + b
    torch.testing.assert_close(y, want, atol=2e-2, rtol=2e-2)


def test_default_model_int4_answers_like_full_precision() -> None:
    cfg = config_from_dict({"model": {"quantization": "int4"}, "cache": {"num_blocks": 64}})
    with LLM(cfg) as llm:
        out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=3, temperature=0.0))
        assert out[0].outputs[0].text.strip().startswith("Paris")
        llm.engine.core.blocks.check_integrity()


def _tiny_model() -> tuple[Any, list[tuple[str, torch.Tensor]]]:
    """A tiny llama (shape "tiny") and its weights under HF names, as a loader hands them out."""
    from rillet.core.attention.torch_backend import TorchAttentionBackend
    from rillet.core.model.decoder import build_model
    from rillet.core.model.shapes import shape_arch

    arch = shape_arch("tiny")
    source = build_model(arch, TorchAttentionBackend(), torch.float32, "cpu")
    source.init_random(seed=5)
    weights: list[tuple[str, torch.Tensor]] = []
    for name, (param, where, _) in source.weight_targets().items():
        weights.append((name, (param.data[where] if where else param.data).clone()))
    return build_model(arch, TorchAttentionBackend(), torch.float32, "cpu"), weights


def test_a_lean_load_quantizes_each_projection_as_it_is_read() -> None:
    """load_weights(int4=True): a projection becomes int4 once its parts are in, while later
    tensors are still unread (the float32 model is never whole), and the model equals one loaded
    in float32 and quantized afterwards, buffer for buffer."""
    from rillet.core.model import int4_layers as int4_mod

    streamed, weights = _tiny_model()
    read = 0
    at_quantize: list[int] = []
    real = int4_mod.quantize_module_weights

    def spy(module: Any, names: tuple[str, ...]) -> None:
        at_quantize.append(read)
        real(module, names)

    def counted() -> Any:
        nonlocal read
        for item in weights:
            read += 1
            yield item

    int4_mod.quantize_module_weights = spy  # type: ignore[assignment]
    try:
        streamed.load_weights(counted(), int4=True)
    finally:
        int4_mod.quantize_module_weights = real  # type: ignore[assignment]
    assert at_quantize and at_quantize[0] < len(weights) // 2, at_quantize
    after, _ = _tiny_model()
    after.load_weights(iter(weights))
    after.quantize_int4()
    want = dict(after.state_dict())
    got = dict(streamed.state_dict())
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("threads", [1, 2])
def test_int8_head_refined_logits_are_the_same_bits_alone_and_in_any_batch(threads: int) -> None:
    """Deterministic mode needs a row's logits independent of its batch: the exact top k are a
    product and a sum per logit, never a batched matmul, whose kernel follows the batch's shape."""
    head = Int8Weight(torch.randn(2048, 576, generator=torch.Generator().manual_seed(7)) * 0.05)
    x = torch.randn(17, 576, generator=torch.Generator().manual_seed(8))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole = head.refine(x, head(x).float())
        for m in (1, 2, 5, 16):
            assert torch.equal(head.refine(x[:m], head(x[:m]).float()), whole[:m])
        for i in range(17):
            assert torch.equal(head.refine(x[i : i + 1], head(x[i : i + 1]).float()), whole[i : i + 1])
    finally:
        torch.set_num_threads(before)
