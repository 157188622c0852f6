"""Bad adapters are one clear error naming the file and the tensor (a config error at start-up),
never a crash or a half-loaded adapter: a rank above lora.max_rank, a model of another hidden
size, a target module the model lacks, a tensor of a layer it lacks, a truncated safetensors file,
a missing B, unsupported PEFT options."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from rillet.core.config import ConfigError
from rillet.core.errors import AdapterError, AdapterErrorKind
from rillet.core.llm import LLM
from rillet.core.lora.adapter import WEIGHTS_FILE, read_adapter
from rillet.core.model.families import arch_from_hf_config
from safetensors.torch import load_file, save_file
from tiny_models.lora_adapters import lora_cfg, make_adapter


@pytest.fixture(scope="module")
def arch(lora_setup: dict[str, Any]) -> Any:
    return arch_from_hf_config(json.loads((Path(lora_setup["folder"]) / "config.json").read_text()))


def _copy(lora_setup: dict[str, Any], tmp_path: Path, name: str = "a1") -> Path:
    dst = tmp_path / f"bad_{name}"
    shutil.copytree(lora_setup["paths"][name], dst)
    return dst


def _read(folder: Path, arch: Any, max_rank: int = 16) -> AdapterError:
    with pytest.raises(AdapterError) as err:
        read_adapter("bad", folder, arch, max_rank, uid=1)
    assert err.value.kind is AdapterErrorKind.INVALID
    return err.value


def _edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_good_adapter_reads(lora_setup: dict[str, Any], arch: Any) -> None:
    adapter = read_adapter("a1", lora_setup["paths"]["a1"], arch, 16, uid=7)
    assert adapter.rank == 8 and adapter.scale == 2.0 and adapter.uid == 7
    assert len(adapter.weights) == 2 * 7  # 2 layers x 7 projections


def test_rank_above_max_rank(lora_setup: dict[str, Any], arch: Any) -> None:
    err = _read(Path(lora_setup["paths"]["a3"]), arch, max_rank=8)  # r 16
    assert "r = 16 is above lora.max_rank (8)" in err.message and "adapter_config.json" in err.message


def test_wrong_hidden_size(lora_setup: dict[str, Any], arch: Any, tiny_hf_model: Any, tmp_path: Path) -> None:
    _, other = tiny_hf_model("llama", hidden_size=96)
    make_adapter(other, tmp_path / "wide", r=4, targets=["q_proj"])
    err = _read(tmp_path / "wide", arch)
    assert WEIGHTS_FILE in err.message and "layers.0.self_attn.q_proj.lora_A.weight" in err.message
    assert "has shape (4, 96), expected (4, 64)" in err.message


def test_target_module_the_model_lacks(lora_setup: dict[str, Any], arch: Any, tmp_path: Path) -> None:
    folder = _copy(lora_setup, tmp_path)
    _edit_config(folder, target_modules=["q_proj", "fc1"])
    assert "target module 'fc1' is not in the model" in _read(folder, arch).message


def test_tensor_of_a_layer_the_model_lacks(lora_setup: dict[str, Any], arch: Any, tmp_path: Path) -> None:
    folder = _copy(lora_setup, tmp_path)
    tensors = load_file(str(folder / WEIGHTS_FILE))
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    tensors[key.replace("layers.0", "layers.5")] = tensors[key].clone()
    save_file(tensors, str(folder / WEIGHTS_FILE))
    err = _read(folder, arch)
    assert "layers.5.self_attn.q_proj.lora_A.weight" in err.message and "no q_proj in layer 5" in err.message


def test_truncated_safetensors(lora_setup: dict[str, Any], arch: Any, tmp_path: Path) -> None:
    folder = _copy(lora_setup, tmp_path)
    data = (folder / WEIGHTS_FILE).read_bytes()
    (folder / WEIGHTS_FILE).write_bytes(data[: len(data) // 2])
    err = _read(folder, arch)
    assert str(folder / WEIGHTS_FILE) in err.message and "truncated or corrupt" in err.message


def test_missing_b_tensor(lora_setup: dict[str, Any], arch: Any, tmp_path: Path) -> None:
    folder = _copy(lora_setup, tmp_path)
    tensors = load_file(str(folder / WEIGHTS_FILE))
    del tensors["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
    save_file(tensors, str(folder / WEIGHTS_FILE))
    assert "layer 1 down_proj has no lora_B tensor" in _read(folder, arch).message


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"bias": "all"}, "bias 'all' is not supported"),
        ({"use_dora": True}, "use_dora = True is not supported"),
        ({"r": 0}, "r must be a positive integer"),
        ({"peft_type": "IA3"}, "is not LORA"),
    ],
)
def test_unsupported_options(
    lora_setup: dict[str, Any], arch: Any, tmp_path: Path, changes: dict[str, Any], words: str
) -> None:
    folder = _copy(lora_setup, tmp_path)
    _edit_config(folder, **changes)
    assert words in _read(folder, arch).message


def test_missing_folder(arch: Any, tmp_path: Path) -> None:
    assert "adapter_config.json not found" in _read(tmp_path / "nothing", arch).message


def test_bad_adapter_in_config_is_a_config_error(lora_setup: dict[str, Any], tmp_path: Path) -> None:
    folder = _copy(lora_setup, tmp_path)
    (folder / WEIGHTS_FILE).write_bytes(b"\x00" * 16)
    cfg = lora_cfg({**lora_setup, "paths": {"ok": lora_setup["paths"]["a1"], "broken": str(folder)}})
    with pytest.raises(ConfigError) as err:
        LLM(cfg)
    assert err.value.key == "lora.adapters.broken" and WEIGHTS_FILE in str(err.value)


def test_adapter_outside_the_target_modules(lora_setup: dict[str, Any]) -> None:
    cfg = lora_cfg(lora_setup, lora={"target_modules": ["q_proj", "v_proj"]})
    with pytest.raises(ConfigError) as err:
        LLM(cfg)
    assert err.value.key == "lora.adapters.a1" and "lora.target_modules leaves out" in str(err.value)


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"speculative": {"method": "ngram"}}, "speculative.method"),
        ({"engine": {"deterministic": "on"}}, "engine.deterministic"),
    ],
)
def test_unsupported_combinations(lora_setup: dict[str, Any], section: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        LLM(lora_cfg(lora_setup, **section))
    assert err.value.key == "lora.adapters" and key in str(err.value)


@pytest.mark.parametrize("alpha", ["NaN", "Infinity", "1e308"])  # Python's json reads NaN and Infinity
def test_alpha_that_is_no_finite_float32_scale(
    lora_setup: dict[str, Any], arch: Any, tmp_path: Path, alpha: str
) -> None:
    """Served, NaN / inf scales made every answer of the adapter garbage, and 1e308 failed the step
    of every row batched with it (the float32 slot scale overflowed)."""
    folder = _copy(lora_setup, tmp_path)
    path = folder / "adapter_config.json"
    text = json.dumps({**json.loads(path.read_text()), "lora_alpha": "ALPHA"})
    path.write_text(text.replace('"ALPHA"', alpha))
    assert "not a finite float32" in _read(folder, arch).message


def test_float64_tensor_that_overflows_float32(lora_setup: dict[str, Any], arch: Any, tmp_path: Path) -> None:
    folder = _copy(lora_setup, tmp_path)
    tensors = {k: v.double() for k, v in load_file(str(folder / WEIGHTS_FILE)).items()}
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    tensors[key] = tensors[key] * 1e300  # finite in float64, inf once read as float32
    save_file(tensors, str(folder / WEIGHTS_FILE))
    err = _read(folder, arch)
    assert key in err.message and "not finite in float32" in err.message


def test_an_overflowing_slot_leaves_other_rows_alone(arch: Any) -> None:
    """Each step multiplies every row by every slot's A: a resident adapter whose x A overflows must
    not reach the rows of the base model or of other adapters (inf * 0 would be NaN there)."""
    from rillet.core.lora.adapter import LoraAdapter
    from rillet.core.lora.stack import LoraStack

    gen = torch.Generator().manual_seed(0)
    q = arch.num_heads * arch.head_dim
    a, b = torch.randn(4, arch.hidden_size, generator=gen), torch.randn(q, 4, generator=gen)
    stack = LoraStack(arch, 2, 4, frozenset({"q_proj"}), torch.device("cpu"))
    stack.write(1, LoraAdapter("ok", "-", 1, 4, 2.0, {(0, "q_proj"): (a, b)}))
    x, slots = torch.rand(3, arch.hidden_size, generator=gen) + 1, torch.tensor([0, 1, 2])
    proj = stack.layers[0].qkv
    assert proj is not None
    want = proj.delta(x, stack.mix(slots))
    stack.write(2, LoraAdapter("huge", "-", 2, 4, 1.0, {(0, "q_proj"): (torch.full_like(a, 1e38), b)}))
    got = proj.delta(x, stack.mix(slots))
    assert torch.equal(got[:2], want[:2])  # the base row and slot 1's row
    assert not bool(torch.isfinite(got[2]).all())  # the huge adapter's own row is its own problem


def test_a_fifo_in_place_of_the_config_is_refused_not_read(
    lora_setup: dict[str, Any], arch: Any, tmp_path: Path
) -> None:
    """Reading a FIFO would block the loading thread forever (the load request never answered)."""
    import os

    folder = _copy(lora_setup, tmp_path)
    (folder / "adapter_config.json").unlink()
    os.mkfifo(folder / "adapter_config.json")
    assert "adapter_config.json" in str(_read(folder, arch))
