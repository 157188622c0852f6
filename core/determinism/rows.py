"""The one rule every deterministic gemm follows: how many rows it is given.

A float32 MKL gemm's output row depends on the other rows only through the kernel MKL picks and the
way it splits the rows between threads, and both follow the row count: one row (a gemv), 2-3 rows
and 4 or more take different kernels, and without strict reproducibility a thread's share that is
not a multiple of its block gets a tail kernel too. So each call is handed a row count on which
every row is computed alike: at least 4 under strict mode (mkl.py), else a multiple of 16 (zero
rows appended, results cut off). The columns (N) and the reduction length (K) of every call site
are fixed by the model (a layer's width, a head size, a 64-key chunk), never by the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

STRICT_MIN_ROWS = 4
LOOSE_MULTIPLE = 16


@dataclass(frozen=True)
class RowPadding:
    strict: bool  # MKL's strict reproducibility is in force

    def rows(self, m: int) -> int:
        if self.strict:
            return max(STRICT_MIN_ROWS, m)
        return -(-m // LOOSE_MULTIPLE) * LOOSE_MULTIPLE

    def pad(self, x: torch.Tensor) -> torch.Tensor:  # [..., M, K] -> [..., rows(M), K], zeros below
        m = x.shape[-2]
        extra = self.rows(m) - m
        return x if extra == 0 else F.pad(x, (0, 0, 0, extra))

    def describe(self) -> str:
        if self.strict:
            return f"MKL strict reproducibility, gemm rows padded to >= {STRICT_MIN_ROWS}"
        return f"MKL not strict, gemm rows padded to multiples of {LOOSE_MULTIPLE}"
