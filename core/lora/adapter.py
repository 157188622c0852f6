"""A LoRA adapter in PEFT's format, read into host memory and checked against the base model.

A folder holds `adapter_config.json` (r, lora_alpha, use_rslora, target_modules, bias) and
`adapter_model.safetensors`, whose tensors are named
`base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight`:
A is [r, in], B is [out, r], and the layer computes y = W x + scale * B (A x), scale = alpha / r
(alpha / sqrt(r) with rsLoRA). Everything is read and checked before the adapter exists: a bad
file is one AdapterError naming the file and the tensor, never a half-built adapter.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rillet.core.config.lora import LORA_MODULES
from rillet.core.errors import AdapterError, AdapterErrorKind
from rillet.core.model.arch import ModelArch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
# PEFT options that change what the weights mean: refused unless at their no-op value
_F32_MAX = torch.finfo(torch.float32).max  # the slots' scales are float32
_NO_OP = {"use_dora": False, "fan_in_fan_out": False, "rank_pattern": {}, "alpha_pattern": {}}

Module = tuple[int, str]  # (layer, module name)


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    path: str
    uid: int  # unique per load: the prefix cache keys blocks by it (a reload is a new adapter)
    rank: int
    scale: float  # lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora
    weights: dict[Module, tuple[torch.Tensor, torch.Tensor]]  # (A [r, in], B [out, r]) float32, host

    @property
    def modules(self) -> frozenset[str]:
        return frozenset(m for _, m in self.weights)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def module_shapes(arch: ModelArch) -> dict[Module, tuple[int, int]]:
    """(layer, module) -> (in, out) of every base projection an adapter may target."""
    h, i = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    out: dict[Module, tuple[int, int]] = {}
    for layer in range(arch.num_layers):
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
        if not arch.is_moe_layer(layer):  # routed experts have no single gate/up/down projection
            shapes |= {"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        out |= {(layer, m): s for m, s in shapes.items()}
    return out


def read_adapter(name: str, folder: str | Path, arch: ModelArch, max_rank: int, uid: int) -> LoraAdapter:
    """The adapter in `folder`, checked against `arch` and `max_rank`; raises AdapterError."""
    path = Path(folder).expanduser()
    cfg = _read_config(name, path / CONFIG_FILE)
    rank, scale, targets = _lora_options(name, path / CONFIG_FILE, cfg, max_rank)
    tensors = _read_tensors(name, path / WEIGHTS_FILE)
    weights = _pair_and_check(name, path / WEIGHTS_FILE, tensors, module_shapes(arch), rank, targets)
    return LoraAdapter(name, str(path), uid, rank, scale, weights)


def _bad(name: str, message: str) -> AdapterError:
    return AdapterError(AdapterErrorKind.INVALID, name, f"LoRA adapter '{name}': {message}")


def _read_config(name: str, file: Path) -> dict[str, Any]:
    if file.exists() and not file.is_file():  # a FIFO or a device would block the reading thread
        raise _bad(name, f"{file} is not a regular file")
    try:
        cfg = json.loads(file.read_text())
    except FileNotFoundError as exc:
        raise _bad(name, f"{file} not found (a PEFT adapter folder holds {CONFIG_FILE})") from exc
    except (OSError, ValueError) as exc:
        raise _bad(name, f"{file} cannot be read as JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise _bad(name, f"{file}: expected a JSON object")
    return cfg


def _lora_options(
    name: str, file: Path, cfg: dict[str, Any], max_rank: int
) -> tuple[int, float, frozenset[str] | None]:
    """(r, scale, the target modules named in the config or None for a regex)."""
    if cfg.get("peft_type", "LORA") != "LORA":
        raise _bad(name, f"{file}: peft_type {cfg.get('peft_type')!r} is not LORA")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha", 8)
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise _bad(name, f"{file}: r must be a positive integer, got {r!r}")
    if r > max_rank:
        raise _bad(name, f"{file}: r = {r} is above lora.max_rank ({max_rank})")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise _bad(name, f"{file}: lora_alpha must be a number, got {alpha!r}")
    if cfg.get("bias", "none") != "none":
        raise _bad(name, f"{file}: bias {cfg.get('bias')!r} is not supported (only 'none')")
    for key, no_op in _NO_OP.items():
        if cfg.get(key) not in (None, no_op):
            raise _bad(name, f"{file}: {key} = {cfg.get(key)!r} is not supported")
    if cfg.get("modules_to_save"):
        raise _bad(name, f"{file}: modules_to_save {cfg['modules_to_save']!r} is not supported")
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    if not math.isfinite(scale) or abs(scale) > _F32_MAX:  # NaN / Infinity parse as JSON numbers here
        raise _bad(name, f"{file}: lora_alpha = {alpha!r} gives the scale {scale!r}, not a finite float32")
    targets = cfg.get("target_modules")
    if isinstance(targets, str):  # a regex over module paths: the tensors say what it matched
        return r, float(scale), None
    if not isinstance(targets, list) or not targets:
        raise _bad(name, f"{file}: target_modules must be a list of module names, got {targets!r}")
    for t in targets:
        if t not in LORA_MODULES:
            raise _bad(name, f"{file}: target module {t!r} is not in the model ({', '.join(LORA_MODULES)})")
    return r, float(scale), frozenset(targets)


def _read_tensors(name: str, file: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    if not file.is_file():
        raise _bad(name, f"{file} not found (only the safetensors format is read)")
    out: dict[str, torch.Tensor] = {}
    key = "<header>"
    try:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (a safe_open handle is not a mapping)
                out[key] = f.get_tensor(key)
    except Exception as exc:  # safetensors raises its own error types for truncated / corrupt files
        raise _bad(name, f"{file}: tensor {key} cannot be read (truncated or corrupt file?): {exc}") from exc
    if not out:
        raise _bad(name, f"{file} holds no tensors")
    return out


def _pair_and_check(
    name: str,
    file: Path,
    tensors: dict[str, torch.Tensor],
    shapes: dict[Module, tuple[int, int]],
    rank: int,
    targets: frozenset[str] | None,
) -> dict[Module, tuple[torch.Tensor, torch.Tensor]]:
    halves: dict[Module, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise _bad(name, f"{file}: tensor {key} is not a LoRA A/B weight of a decoder layer projection")
        layer, group, module, half = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        where = (layer, module)
        if module not in LORA_MODULES or (group == "self_attn") != (module in _ATTN):
            raise _bad(name, f"{file}: tensor {key}: the model has no module {group}.{module}")
        if targets is not None and module not in targets:
            raise _bad(name, f"{file}: tensor {key}: {module} is not in the config's target_modules")
        if where not in shapes:
            raise _bad(name, f"{file}: tensor {key}: the model has no {module} in layer {layer}")
        d_in, d_out = shapes[where]
        want = (rank, d_in) if half == "A" else (d_out, rank)
        if tuple(t.shape) != want:
            raise _bad(name, f"{file}: tensor {key} has shape {tuple(t.shape)}, expected {want}")
        if not t.is_floating_point():
            raise _bad(name, f"{file}: tensor {key} is not floating point")
        t = t.float().contiguous()  # checked after the cast: a float64 1e300 is inf in float32
        if not bool(torch.isfinite(t).all()):
            raise _bad(name, f"{file}: tensor {key} is not finite in float32")
        halves.setdefault(where, {})[half] = t
    out: dict[Module, tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            missing = "B" if "A" in pair else "A"
            raise _bad(name, f"{file}: layer {layer} {module} has no lora_{missing} tensor")
        out[(layer, module)] = (pair["A"], pair["B"])
    return out
