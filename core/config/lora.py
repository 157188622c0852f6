"""`lora`: LoRA adapters served over the base model, selected per request by `model`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from rillet.core.config.errors import check

# The projections an adapter may target (PEFT's module names for Llama-style decoders).
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MAX_LORA_RANK = 256
# an adapter's name is what requests send as `model`: no spaces; `/` only between parts, as in
# the hub's `org/name` that vLLM users name adapters by (a name is never used as a path)
_NAME = re.compile(r"^(?=.{1,128}$)[A-Za-z0-9][A-Za-z0-9._:@+-]*(/[A-Za-z0-9][A-Za-z0-9._:@+-]*)*$")
# The stacked buffers' dtype (core/lora/setup.py resolves auto): bfloat16 when the base projections
# take bfloat16 operands (int4 weights, a bfloat16 model), float32 otherwise.
LoraDType = Literal["auto", "float32", "bfloat16"]


def valid_adapter_name(name: str) -> bool:
    return bool(_NAME.match(name))


@dataclass(frozen=True)
class LoraConfig:
    # name -> folder (adapter_config.json + adapter_model.safetensors), loaded at start-up
    adapters: dict[str, str] = field(default_factory=dict)
    max_loras: int = 4  # adapters resident in the stacked buffers at once (slots)
    max_rank: int = 16  # the buffers' rank per slot: adapters of a higher r are refused
    allow_runtime_updates: bool = False  # POST /v1/load_lora_adapter and /v1/unload_lora_adapter
    # projections the buffers hold (each one costs a shrink and an expand per step); () = those the
    # start-up adapters target, or all seven when none is given at start-up
    target_modules: tuple[str, ...] = ()
    dtype: LoraDType = "auto"

    def __post_init__(self) -> None:
        check(self.max_loras >= 1, "lora.max_loras", f"must be >= 1, got {self.max_loras}")
        check(
            1 <= self.max_rank <= MAX_LORA_RANK,
            "lora.max_rank",
            f"must be in 1..{MAX_LORA_RANK}, got {self.max_rank}",
        )
        for name, path in self.adapters.items():
            check(
                valid_adapter_name(name),
                f"lora.adapters.{name}",
                "1-128 letters, digits or ._:@+-, parts joined by / (an adapter name is sent as `model`)",
            )
            check(bool(path), f"lora.adapters.{name}", "needs the adapter's folder")
        for m in self.target_modules:
            check(m in LORA_MODULES, "lora.target_modules", f"{m!r} is not one of {', '.join(LORA_MODULES)}")

    @property
    def enabled(self) -> bool:
        """LoRA buffers are allocated: adapters at start-up, or loadable while serving."""
        return bool(self.adapters) or self.allow_runtime_updates
