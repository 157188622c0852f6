"""transformers' own load of the default model's GGUF file: the independent reference that the
loader, engine and LoRA tests compare rillet against."""

from __future__ import annotations

import functools
from typing import Any

import gguf
import pytest
import torch
from rillet.core.loaders.default_model import default_model_path


def hf_default_model() -> Any:
    """The default model as transformers loads it from the GGUF file (float32, in eval).

    transformers rebuilds gguf's pure (arch, layers) -> names table once per module of the model
    (~400 times, ~10 s of a cold CI run, once per test module that loads it); memoizing it
    changes nothing but the time."""
    import transformers

    path = default_model_path()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
    return model.eval()


def hf_default_tokenizer() -> Any:
    """transformers' tokenizer of the default model, from the same GGUF file."""
    import transformers

    path = default_model_path()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
