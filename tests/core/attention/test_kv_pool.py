"""cache.dtype: which storage a pool gets where, how many blocks a memory budget holds in it, and
the backends that cannot read it saying so by key."""

from __future__ import annotations

import pytest
import torch
from rillet.core.attention.kv_cache import bytes_per_token, describe_pool, resolve_kv_dtype
from rillet.core.attention.select import select_attention_backend
from rillet.core.build import kv_capacity
from rillet.core.config import AttentionConfig, ConfigError, config_from_dict
from rillet.core.model.arch import ModelArch

ARCH = ModelArch(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=128,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
)
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_auto_keeps_the_model_dtype_and_names_map_to_storage() -> None:
    assert resolve_kv_dtype("auto", torch.float32, CPU) == torch.float32
    assert resolve_kv_dtype("auto", torch.bfloat16, CUDA) == torch.bfloat16
    assert resolve_kv_dtype("int8", torch.float32, CPU) == torch.int8
    assert resolve_kv_dtype("bfloat16", torch.float32, CPU) == torch.bfloat16
    assert resolve_kv_dtype("fp8_e4m3", torch.bfloat16, CUDA) == torch.float8_e4m3fn  # no GPU needed


def test_fp8_on_cpu_is_a_config_error_naming_cache_dtype() -> None:
    with pytest.raises(ConfigError) as err:
        resolve_kv_dtype("fp8_e4m3", torch.float32, CPU)
    assert err.value.key == "cache.dtype" and "int8" in str(err.value)
    cfg = config_from_dict({"cache": {"dtype": "fp8_e4m3"}})
    with pytest.raises(ConfigError, match=r"cache\.dtype"):  # at start-up, before any pool is made
        kv_capacity(cfg, ARCH, torch.float32, CPU)


def test_unknown_dtype_is_refused_when_loaded() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({}, ["cache.dtype=q4_0"])
    assert err.value.key == "cache.dtype"


def test_the_same_budget_holds_blocks_in_proportion_to_storage_bytes() -> None:
    """float32: 4 bytes a value; int8: 1 byte a value + a 4-byte scale per token per KV head."""
    d, per = ARCH.head_dim, 2 * ARCH.num_layers * ARCH.num_kv_heads
    assert bytes_per_token(ARCH, torch.float32) == per * 4 * d
    assert bytes_per_token(ARCH, torch.bfloat16) == per * 2 * d
    assert bytes_per_token(ARCH, torch.int8) == per * (d + 4)
    blocks = {}
    for name in ("auto", "bfloat16", "int8"):
        cfg = config_from_dict({"cache": {"memory_gb": 0.25, "block_size": 16, "dtype": name}})
        blocks[name] = kv_capacity(cfg, ARCH, torch.float32, CPU)
    budget = 0.25 * 2**30
    assert blocks["auto"] == int(budget // (16 * per * 4 * d))
    assert blocks["int8"] == int(budget // (16 * per * (d + 4)))
    assert blocks["bfloat16"] == int(budget // (16 * per * 2 * d))
    assert blocks["int8"] > 3 * blocks["auto"]  # 4d / (d + 4) = 3.2 at head_dim 16
    pinned = config_from_dict({"cache": {"num_blocks": 100, "dtype": "int8"}})
    assert kv_capacity(pinned, ARCH, torch.float32, CPU) == 100  # an explicit size wins


@pytest.mark.parametrize(
    ("section", "key"),
    [({"num_blocks": 10**12}, "cache.num_blocks"), ({"memory_gb": 10**6}, "cache.memory_gb")],
)
def test_a_pool_larger_than_the_machine_is_a_config_error(section: dict[str, int], key: str) -> None:
    """Before any allocation: past the machine's memory the OOM killer would end the server later."""
    with pytest.raises(ConfigError) as err:
        kv_capacity(config_from_dict({"cache": section}), ARCH, torch.float32, CPU)
    assert err.value.key == key and "GiB" in str(err.value)


def test_start_up_summary_says_tokens_and_storage() -> None:
    line = describe_pool(ARCH, 99, 16, torch.int8)
    assert "99 blocks x 16 tokens = 1584 tokens" in line and "int8" in line


def test_int8_gets_the_torch_backend_or_a_config_error() -> None:
    """flashinfer reads no int8 codes: auto picks torch on CUDA too, flashinfer asked for is refused."""
    sel = select_attention_backend(AttentionConfig(), CUDA, ARCH, torch.int8)
    assert sel.backend == "torch" and any("int8" in line for line in sel.log_lines)
    for key in ("backend", "prefill_backend"):
        with pytest.raises(ConfigError) as err:
            select_attention_backend(AttentionConfig(**{key: "flashinfer"}), CUDA, ARCH, torch.int8)
        assert err.value.key == "cache.dtype"
