"""Loads a local Hugging Face model folder: config.json + *.safetensors (one file or sharded).

Tokenizer files are only located here (`HFFolder`); reading them is core/tokenizer/tokenizer.py's job.
The config is read into a ModelArch by core/model/families.py (which knows transformers' older
and newer spellings: `rope_theta` + `rope_scaling` or `rope_parameters`, `layer_types` or not).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rillet.core.model.arch import ModelArch
from rillet.core.model.families import arch_from_hf_config
from safetensors import safe_open

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HFFolder:
    root: Path
    config: Path
    weight_files: tuple[Path, ...]
    tokenizer_json: Path | None  # tokenizer.json (fast tokenizer), if present
    tokenizer_config: Path | None  # tokenizer_config.json (chat template, special tokens), if present
    generation_config: Path | None


def _optional(path: Path) -> Path | None:
    return path if path.is_file() else None


def find_hf_folder(path: str | Path) -> HFFolder:
    root = Path(path)
    config = root / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{root}: no config.json (not a Hugging Face model folder)")
    index = root / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = tuple(root / s for s in shards)
    else:
        files = tuple(sorted(root.glob("*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{root}: no *.safetensors weights (.bin checkpoints are not supported)")
    return HFFolder(
        root=root,
        config=config,
        weight_files=files,
        tokenizer_json=_optional(root / "tokenizer.json"),
        tokenizer_config=_optional(root / "tokenizer_config.json"),
        generation_config=_optional(root / "generation_config.json"),
    )


def read_hf_config(folder: HFFolder) -> dict[str, Any]:
    """config.json with the EOS ids of generation_config.json merged in (Llama 3 lists its extra
    stop tokens only there)."""
    cfg: dict[str, Any] = json.loads(folder.config.read_text())
    if folder.generation_config is not None:
        gen_eos = json.loads(folder.generation_config.read_text()).get("eos_token_id")
        ids = _as_list(cfg.get("eos_token_id")) + _as_list(gen_eos)
        if ids:
            cfg["eos_token_id"] = list(dict.fromkeys(ids))
    return cfg


def _as_list(x: Any) -> list[int]:
    if x is None:
        return []
    return [int(i) for i in x] if isinstance(x, list) else [int(x)]


def iter_safetensors(
    files: Iterator[Path] | tuple[Path, ...], dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor in `files`, cast to `dtype` (on CPU), one at a time."""
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open is not a mapping
                t = st.get_tensor(name)
                yield name, (t.to(dtype) if t.is_floating_point() else t)


def load_hf_folder(
    path: str | Path, dtype: torch.dtype = torch.float32
) -> tuple[ModelArch, Iterator[tuple[str, torch.Tensor]]]:
    """-> (architecture, lazy iterator of (HF name, tensor in `dtype`)) for `DecoderModel.load_weights`."""
    folder = find_hf_folder(path)
    return arch_from_hf_config(read_hf_config(folder)), iter_safetensors(folder.weight_files, dtype)
