"""Dense float32 projections whose output rows do not depend on the batch (rows.py's rule).

`RowPaddedWeight` stands in for a [N, K] weight the way Int4Weight does (core/quant/int4.py `lin`
calls it): the input's rows are padded to a count MKL computes every row of alike, and the padding
rows' results are dropped. N and K are the layer's, fixed. Int4/Int8 weights need nothing: torch's
weight-only kernels compute each row alone (measured bit-identical from 1 to 2048 rows), and so
does oneDNN's bfloat16 linear; only float32 weights (MKL) are wrapped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from rillet.core.determinism.rows import RowPadding
from torch import nn


class RowPaddedWeight(nn.Module):
    def __init__(self, weight: torch.Tensor, rows: RowPadding) -> None:
        super().__init__()
        self.weight = weight  # shared with the model (a tied head is the embedding itself)
        self.padding = rows
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        flat = x.reshape(-1, self.in_features)
        y = F.linear(self.padding.pad(flat), self.weight)[: flat.shape[0]]
        return y.view(*x.shape[:-1], self.out_features)


def pad_module_weights(module: nn.Module, names: tuple[str, ...], rows: RowPadding) -> None:
    """Replaces the named float32 2-D parameters of `module` by RowPaddedWeight stand-ins."""
    for name in names:
        w = getattr(module, name, None)
        if isinstance(w, torch.Tensor) and w.dim() == 2 and w.dtype == torch.float32:
            delattr(module, name)
            setattr(module, name, RowPaddedWeight(w.data, rows))
