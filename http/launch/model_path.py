"""`model.path` checked before anything else starts: a clear one-line error (exit 2), not a traceback
from deep inside a loader after the port is already bound.

Only the server's own config names a path; no request field is ever used as one (a request's
`model` is compared with the served name and nothing else).
"""

from __future__ import annotations

import os
from pathlib import Path

from rillet.core.config import ConfigError, RilletConfig

GGUF_MAGIC = b"GGUF"


def check_model_path(cfg: RilletConfig) -> None:
    """Raises ConfigError('model.path', why) when the configured model cannot be what it claims."""
    m = cfg.model
    if m.kind == "shape" or m.path is None:  # random weights / the packaged default model
        return
    path = Path(m.path).expanduser()
    if not path.exists():
        raise ConfigError("model.path", f"{path} does not exist (a .gguf file or a Hugging Face folder)")
    if not os.access(path, os.R_OK):
        raise ConfigError("model.path", f"{path} is not readable by this user")
    if path.is_dir():
        if m.kind in ("auto", "hf") and not (path / "config.json").is_file():
            raise ConfigError("model.path", f"{path} is not a Hugging Face folder (no config.json)")
        if m.kind == "gguf":
            raise ConfigError("model.path", f"{path} is a folder, not a .gguf file")
        return
    if m.kind == "hf":
        raise ConfigError("model.path", f"{path} is a file, not a Hugging Face folder")
    with path.open("rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise ConfigError("model.path", f"{path} is not a GGUF file (it does not start with 'GGUF')")
