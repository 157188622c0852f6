"""A Gemma 3 folder's vision hyper-parameters (config.json) and image preprocessing
(preprocessor_config.json), read once and checked.

config.json nests the tower under `vision_config` (SigLIP's defaults fill what a released config
leaves out) with `mm_tokens_per_image` and the image token ids at the top; a flat config (the keys
`vision_*` at the top, as some converted checkpoints write them) is read too. Pan-and-scan
(`do_pan_and_scan` true) is refused: its crops change how many image tokens an image takes."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rillet.core.config import ConfigError

# SiglipVisionConfig's defaults, as transformers fills them
_SIGLIP = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
_TEXT_HIDDEN = 2304  # Gemma3TextConfig's hidden_size


@dataclass(frozen=True)
class Gemma3VisionArch:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_channels: int
    image_size: int
    patch_size: int
    layer_norm_eps: float
    hidden_act: str  # gelu_tanh | gelu
    mm_tokens_per_image: int
    text_hidden_size: int
    boi_token_id: int  # <start_of_image>: what the chat template writes for an image
    eoi_token_id: int  # <end_of_image>
    image_token_id: int  # <image_soft_token>: one per image embedding

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def pool_kernel(self) -> int:
        return self.patches_per_side // math.isqrt(self.mm_tokens_per_image)


def _vision_section(cfg: dict[str, Any]) -> dict[str, Any]:
    nested = cfg.get("vision_config")
    if isinstance(nested, dict):
        return {**_SIGLIP, **nested}
    flat = {
        k[len("vision_") :]: v for k, v in cfg.items() if k.startswith("vision_") and k != "vision_config"
    }
    return {**_SIGLIP, **flat}


def vision_arch(cfg: dict[str, Any]) -> Gemma3VisionArch:
    """From a Gemma 3 config.json dict; ConfigError (`model.path`) for what the tower cannot run."""
    v = _vision_section(cfg)
    text = cfg.get("text_config") or {}
    act = str(v["hidden_act"])
    arch = Gemma3VisionArch(
        hidden_size=int(v["hidden_size"]),
        intermediate_size=int(v["intermediate_size"]),
        num_layers=int(v["num_hidden_layers"]),
        num_heads=int(v["num_attention_heads"]),
        num_channels=int(v["num_channels"]),
        image_size=int(v["image_size"]),
        patch_size=int(v["patch_size"]),
        layer_norm_eps=float(v["layer_norm_eps"]),
        hidden_act="gelu_tanh" if act in ("gelu_pytorch_tanh", "gelu_tanh") else act,
        mm_tokens_per_image=int(cfg.get("mm_tokens_per_image", 256)),
        text_hidden_size=int(text.get("hidden_size", cfg.get("hidden_size", _TEXT_HIDDEN))),
        boi_token_id=int(cfg.get("boi_token_index", cfg.get("boi_token_id", 255_999))),
        eoi_token_id=int(cfg.get("eoi_token_index", cfg.get("eoi_token_id", 256_000))),
        image_token_id=int(cfg.get("image_token_index", cfg.get("image_token_id", 262_144))),
    )
    _check(arch)
    return arch


def _check(a: Gemma3VisionArch) -> None:
    side = math.isqrt(a.mm_tokens_per_image)
    why = None
    if a.hidden_act not in ("gelu_tanh", "gelu"):
        why = f"vision_config.hidden_act {a.hidden_act!r} is not supported (gelu_pytorch_tanh, gelu)"
    elif a.image_size % a.patch_size or side * side != a.mm_tokens_per_image:
        why = f"mm_tokens_per_image {a.mm_tokens_per_image} is not a square of a whole number"
    elif a.patches_per_side % side:
        why = f"{a.patches_per_side} patches a side do not pool evenly to {side} tokens a side"
    if why is not None:
        raise ConfigError("model.path", f"config.json: {why}")


@dataclass(frozen=True)
class Gemma3Preprocess:
    """Gemma3ImageProcessor's fixed-size path: resize (Pillow, `resample`), rescale, normalize."""

    height: int
    width: int
    resample: int  # a PIL.Image.Resampling value (2: bilinear, transformers' default here)
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]


def _triple(x: Any, key: str) -> tuple[float, float, float]:
    vals = [float(x)] * 3 if isinstance(x, int | float) else [float(e) for e in x]
    if len(vals) != 3:
        raise ConfigError("model.path", f"preprocessor_config.json: {key} needs 3 values, has {len(vals)}")
    return vals[0], vals[1], vals[2]


def preprocess_spec(folder: Path, arch: Gemma3VisionArch) -> Gemma3Preprocess:
    """preprocessor_config.json (or processor_config.json's `image_processor`); absent: the
    processor's defaults at the tower's image size."""
    p: dict[str, Any] = {}
    for name in ("preprocessor_config.json", "processor_config.json"):
        path = folder / name
        if path.is_file():
            raw = json.loads(path.read_text())
            p = raw.get("image_processor", raw) if name == "processor_config.json" else raw
            break
    if p.get("do_pan_and_scan"):
        why = "preprocessor_config.json: do_pan_and_scan true (Gemma 3's crops) is not supported"
        raise ConfigError("model.path", why)
    if not p.get("do_resize", True):
        raise ConfigError("model.path", "preprocessor_config.json: do_resize false is not supported")
    size = p.get("size") or {}
    height = int(size.get("height", arch.image_size))
    width = int(size.get("width", arch.image_size))
    if (height, width) != (arch.image_size, arch.image_size):
        why = f"preprocessor_config.json: size {height}x{width} is not the tower's {arch.image_size}"
        raise ConfigError("model.path", why)
    return Gemma3Preprocess(
        height=height,
        width=width,
        resample=int(p.get("resample", 2)),
        do_rescale=bool(p.get("do_rescale", True)),
        rescale_factor=float(p.get("rescale_factor", 1 / 255)),
        do_normalize=bool(p.get("do_normalize", True)),
        image_mean=_triple(p.get("image_mean", 0.5), "image_mean"),
        image_std=_triple(p.get("image_std", 0.5), "image_std"),
    )
