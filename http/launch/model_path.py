"""`model.path` (and `speculative.draft_model`) checked before anything else starts: a clear
one-line error (exit 2), not a traceback from deep inside a loader after the port is already
bound. That includes a model of a family rillet does not run (its HF model_type or GGUF
architecture, named with the supported list).

Only the server's own config names a path; no request field is ever used as one (a request's
`model` is compared with the served name and nothing else).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rillet.core.config import ConfigError, RilletConfig
from rillet.core.loaders.gguf_arch import SUPPORTED_ARCHITECTURES
from rillet.core.loaders.gguf_file import read_gguf
from rillet.core.model.families import ENCODER_MODEL_TYPES, HF_MODEL_TYPES, UnsupportedArchitecture

GGUF_MAGIC = b"GGUF"


def check_model_path(cfg: RilletConfig) -> None:
    """Raises ConfigError('model.path', why) when the configured model cannot be what it claims;
    the same for `speculative.draft_model` when drafts come from it."""
    m = cfg.model
    if m.kind != "shape" and m.path is not None:  # else random weights / the packaged default model
        _check(Path(m.path).expanduser(), m.kind, "model.path", embed_only=m.task == "embed")
    spec = cfg.speculative
    if spec.method == "draft" and spec.draft_model:
        _check(Path(spec.draft_model).expanduser(), "auto", "speculative.draft_model", embed_only=False)


def _check(path: Path, kind: str, key: str, embed_only: bool) -> None:
    if not path.exists():
        raise ConfigError(key, f"{path} does not exist (a .gguf file or a Hugging Face folder)")
    if not os.access(path, os.R_OK):
        raise ConfigError(key, f"{path} is not readable by this user")
    if path.is_dir():
        if kind in ("auto", "hf") and not (path / "config.json").is_file():
            raise ConfigError(key, f"{path} is not a Hugging Face folder (no config.json)")
        if kind == "gguf":
            raise ConfigError(key, f"{path} is a folder, not a .gguf file")
        _check_hf_family(path / "config.json", key, embed_only)
        return
    if kind == "hf":
        raise ConfigError(key, f"{path} is a file, not a Hugging Face folder")
    with path.open("rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise ConfigError(key, f"{path} is not a GGUF file (it does not start with 'GGUF')")
    try:
        arch = read_gguf(path).architecture
    except ValueError as exc:
        raise ConfigError(key, str(exc)) from exc
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitecture("GGUF architecture", arch, SUPPORTED_ARCHITECTURES)


def _check_hf_family(config: Path, key: str, embed_only: bool) -> None:
    """The folder's model_type is one rillet runs (the families of core/model/families.py); an
    encoder's only for embeddings: a sentence-transformers folder, or a bare one with model.task
    embed (cls pooling, core/embed_build.py)."""
    try:
        model_type = json.loads(config.read_text()).get("model_type", "llama")
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(key, f"{config} is not a readable JSON object ({exc})") from exc
    if model_type in ENCODER_MODEL_TYPES and (embed_only or (config.parent / "modules.json").is_file()):
        return  # served for /v1/embeddings (a sentence-transformers folder: model.task auto -> embed)
    if model_type not in HF_MODEL_TYPES:
        raise UnsupportedArchitecture("model_type", str(model_type), HF_MODEL_TYPES)
