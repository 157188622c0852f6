"""The draft model's weights (speculative.draft_quantization) resolve for the draft's own file as
model.quantization does for the model's, and it runs in the model's dtype: a 4-bit GGUF draft keeps
int4 weights under auto beside an int4 model, full-precision ones beside an explicit float32 one."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rillet.core.build import Precision
from rillet.core.config import config_from_dict
from rillet.core.loaders.default_model import default_model_path
from rillet.core.quant.int4 import int4_supported
from rillet.core.spec import draft_model
from rillet.core.tokenizer.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(not int4_supported(), reason="no CPU int4 kernel in this torch build")


class _Loaded(Exception):
    """Raised by the stand-in for load_model: the precision is known, no weights are read."""


@pytest.mark.parametrize(("target", "want"), [({}, "int4"), ({"dtype": "float32"}, "none")])
def test_a_4bit_gguf_draft_resolves_its_weights_as_the_model_does(
    monkeypatch: pytest.MonkeyPatch, target: dict[str, Any], want: str
) -> None:
    path = default_model_path()  # Q4_1: int4 under auto on CPU
    cfg = config_from_dict({"model": target, "speculative": {"method": "draft", "draft_model": str(path)}})
    seen: list[Precision] = []

    def load_model(dcfg: Any, src: Any, device: Any, precision: Precision, progress: Any) -> Any:
        seen.append(precision)
        raise _Loaded

    monkeypatch.setattr(draft_model, "load_model", load_model)
    target_model: Any = None  # read only after the draft has loaded
    with pytest.raises(_Loaded):
        draft_model.load_draft_drafter(
            cfg, target_model, torch.device("cpu"), torch.float32, 8, Tokenizer.from_gguf(path)
        )
    assert [(p.quantization, p.dtype) for p in seen] == [(want, torch.float32)]
