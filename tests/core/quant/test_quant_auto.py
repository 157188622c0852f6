"""`model.quantization: auto`: int4 for a mostly 4-bit GGUF on CPU with dtype auto/bfloat16, else none.

The resolution reads only GGUF tensor infos, so tiny files written here with `gguf.GGUFWriter` stand
in for real models (their data is random); one engine on the default model checks the whole path.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from rillet.core.config import ModelConfig, config_from_dict
from rillet.core.llm import LLM
from rillet.core.loaders.default_model import default_model_path
from rillet.core.quant import select as quant_select
from rillet.core.quant.int4 import Int4Weight, int4_supported
from rillet.core.quant.select import resolve_quantization
from rillet.core.sampling_params import SamplingParams

pytestmark = pytest.mark.isa  # run again under an AVX2 cap (tests/test_isa_cap.py)

CPU = torch.device("cpu")
needs_int4 = pytest.mark.skipif(not int4_supported(), reason="no CPU int4 kernel in this torch")
Q = gguf.GGMLQuantizationType


def write_gguf(path: Path, tensors: dict[str, tuple[tuple[int, int] | tuple[int], Q]]) -> Path:
    """A header-complete GGUF holding `name: (torch shape, ggml type)` tensors of random bytes."""
    w = gguf.GGUFWriter(str(path), "llama")
    rng = np.random.default_rng(0)
    for name, (shape, kind) in tensors.items():
        values = rng.standard_normal(shape).astype(np.float32)
        if kind == Q.F32:
            w.add_tensor(name, values)
        elif kind == Q.F16:
            w.add_tensor(name, values.astype(np.float16))
        else:  # stored bytes only: resolution never reads them
            block, size = gguf.GGML_QUANT_SIZES[kind]
            raw = rng.integers(0, 256, (*shape[:-1], shape[-1] // block * size), dtype=np.uint8)
            w.add_tensor(name, raw, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def layer_file(path: Path, proj: Q, embd: Q = Q.Q8_0, k: int = 64) -> Path:
    """One layer: q/o (64 x k) and down (64 x 128) projections in `proj`, a norm, an embedding."""
    return write_gguf(
        path,
        {
            "token_embd.weight": ((256, 64), embd),
            "blk.0.attn_norm.weight": ((64,), Q.F32),
            "blk.0.attn_q.weight": ((64, k), proj),
            "blk.0.attn_output.weight": ((64, k), proj),
            "blk.0.ffn_down.weight": ((64, 128), proj),
        },
    )


def auto(path: Path | None, kind: str = "gguf", device: torch.device = CPU, **model: Any) -> str:
    return resolve_quantization(ModelConfig(**model), kind, path, device).quantization


@needs_int4
def test_default_model_on_cpu_resolves_to_int4() -> None:
    choice = resolve_quantization(ModelConfig(), "gguf", default_model_path(), CPU)
    assert choice.quantization == "int4" and "100%" in choice.reason  # every layer matrix is Q4_1
    assert auto(default_model_path(), dtype="bfloat16") == "int4"


def test_full_precision_dtypes_and_other_kinds_resolve_to_none() -> None:
    path = default_model_path()
    assert auto(path, dtype="float32") == "none"  # an explicit float32 asks for fp32
    assert auto(path, dtype="float16") == "none"
    assert auto(path, device=torch.device("cuda")) == "none"  # int4 runs on the CPU only
    for kind in ("synthetic", "shape", "hf"):
        assert auto(None if kind != "hf" else path.parent, kind=kind) == "none"


def test_explicit_values_pass_through() -> None:
    path = default_model_path()
    assert auto(path, quantization="none") == "none"
    assert auto(path, quantization="int4", dtype="float32") == "int4"  # resolve_dtype rejects it later
    assert auto(None, kind="synthetic", quantization="int4") == "int4"


def test_no_kernel_resolves_to_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quant_select, "int4_supported", lambda: False)
    choice = resolve_quantization(ModelConfig(), "gguf", default_model_path(), CPU)
    assert choice.quantization == "none" and "kernel" in choice.reason


@needs_int4
@pytest.mark.parametrize(
    ("proj", "want"),
    [
        *[(t, "none") for t in (Q.F32, Q.F16, Q.Q8_0, Q.Q5_0)],
        *[(t, "int4") for t in (Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q2_K)],
    ],
    ids=lambda v: v.name if isinstance(v, Q) else v,
)
def test_gguf_weight_types(tmp_path: Path, proj: Q, want: str) -> None:
    k = 256 if proj in (Q.Q4_K, Q.Q2_K) else 64  # K-quants come in blocks of 256
    down = 256 if k == 256 else 128
    path = write_gguf(
        tmp_path / "m.gguf",
        {
            "token_embd.weight": ((256, k), Q.F32),  # a wide embedding never counts
            "blk.0.attn_q.weight": ((64, k), proj),
            "blk.0.ffn_down.weight": ((64, down), proj),
        },
    )
    assert auto(path) == want


@needs_int4
def test_majority_by_element_count(tmp_path: Path) -> None:
    # 4-bit q/o (2 x 64 x 64) against a Q8_0 down (64 x 128): an exact half is not "most"
    half = write_gguf(
        tmp_path / "half.gguf",
        {
            "blk.0.attn_q.weight": ((64, 64), Q.Q4_0),
            "blk.0.attn_output.weight": ((64, 64), Q.Q4_0),
            "blk.0.ffn_down.weight": ((64, 128), Q.Q8_0),
        },
    )
    assert auto(half) == "none"
    assert auto(layer_file(tmp_path / "most.gguf", Q.Q4_1, embd=Q.F32)) == "int4"


@needs_int4
def test_an_input_dim_int4_cannot_group_resolves_to_none(tmp_path: Path) -> None:
    path = write_gguf(
        tmp_path / "odd.gguf",
        {"blk.0.attn_q.weight": ((256, 64), Q.Q4_0), "blk.0.attn_output.weight": ((64, 40), Q.F16)},
    )
    choice = resolve_quantization(ModelConfig(), "gguf", path, CPU)
    assert choice.quantization == "none" and "attn_output" in choice.reason


@needs_int4
def test_default_config_engine_runs_int4(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rillet.core")
    with LLM(config_from_dict({"cache": {"num_blocks": 64}})) as llm:
        rt = llm.engine.runtime
        assert (rt.quantization, rt.dtype) == ("int4", torch.float32)  # fp32 model, int4 weights
        model: Any = llm.engine.core.runner.model  # type: ignore[attr-defined]
        assert isinstance(model.layers[0].qkv_weight, Int4Weight) and model.quant_head is not None
        out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=2, temperature=0.0))
        assert out[0].outputs[0].text.strip().startswith("Paris")
        # A chat answer that an int4 LM head (re-quantized from the Q8_0 embedding) got wrong.
        chat = llm.tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}]
        )
        out = llm.generate([chat], SamplingParams(max_tokens=12, temperature=0.0))
        assert "Paris" in out[0].outputs[0].text
    assert any("quantization auto -> int4" in r.getMessage() for r in caplog.records)
