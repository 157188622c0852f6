"""Projection: the oneDNN path (packed weight, fused bias and activation) equals F.linear + the
activation; where it cannot pack (not float32) the dense weight stays and F.linear runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from rillet.core.model.packed_linear import ACTIVATIONS, Projection, onednn_available

needs_onednn = pytest.mark.skipif(
    not onednn_available(torch.empty(1)), reason="torch without oneDNN on this CPU"
)


def _projection(act: str | None, dtype: torch.dtype = torch.float32) -> Projection:
    torch.manual_seed(0)
    p = Projection(24, 40, act).to(dtype)
    p.weight.data.normal_()
    p.bias.data.normal_()
    return p


@needs_onednn
@pytest.mark.parametrize("act", [None, *ACTIVATIONS])
def test_packed_equals_linear_and_activation(act: str | None) -> None:
    p = _projection(act)
    w, b = p.weight.data.clone(), p.bias.data.clone()
    x = torch.randn(3, 5, 24)  # [B, S, K]
    want = F.linear(x, w, b)
    want = want if act is None else ACTIVATIONS[act](want)
    assert p.pack() and p.packed is not None
    assert p.weight.numel() == 0  # the dense copy is freed
    with torch.inference_mode():
        got = p(x)
    assert got.shape == (3, 5, 40)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert p.pack()  # packing again is a no-op


def test_other_dtypes_keep_f_linear() -> None:
    p = _projection("gelu", torch.bfloat16)
    assert not p.pack() and p.packed is None and p.weight.shape == (40, 24)
    x = torch.randn(4, 24, dtype=torch.bfloat16)
    torch.testing.assert_close(p(x), F.gelu(F.linear(x, p.weight, p.bias)))


def test_unknown_activation_is_refused() -> None:
    with pytest.raises(ValueError, match="activation 'swish'"):
        Projection(4, 4, "swish")
