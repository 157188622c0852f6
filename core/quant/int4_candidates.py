"""The LM head's candidate pass for few rows: the head in int4 through rillet's kernel.

A plain greedy row needs from the head only which tokens could be its best (Int8Weight then
computes those exactly: core/quant/candidate_head.py). At a few rows the pass is a read of the
head: oneDNN's int8 GEMM reads 28 MB for the default model's 49,152 x 576 head, this copy in int4
(group 32, min/max as Int4Weight) 14 MB plus 3.5 MB of scales. rillet's kernel
(core/quant/rows_kernel.py) computes each row on its own, so its cost grows by the row where
oneDNN's stays near one pass. A greedy row's token through each, cold, 2 threads, on a Zen 4
EPYC (`python -m bench.kernels.lm_head`, bench/RESULTS.md 2026-12-05): 0.86 / 0.96 / 1.23 / 2.46
/ 4.17 ms at 1 / 2 / 4 / 8 / 16 rows against oneDNN's 1.46 / 1.54 / 1.58 / 2.25 / 3.10; the two
meet between 5 and 8 rows on 2 threads and between 4 and 5 on one. So it takes batches of up to
ROWS_PER_THREAD rows a thread (at most MAX_ROWS), and oneDNN (or the bf16 kernel) larger ones.

Where the CPU has AVX2 but no AVX512-BF16 the copy goes through rillet's AVX2 kernel
(avx2_kernel.py: int8 activations) instead: there oneDNN's int8 GEMM does not sum exactly
(candidate_head.py) and the alternative is torch's int8 kernel with bf16 activations, which AVX2
widens in software, so it takes batches of up to AVX2_MAX_ROWS.

Its logits are further off than oneDNN's (mean error 0.43 against 0.11 on the default model's
hidden states; the best token ranked at most 6th by them in 1,698 rows; 16 candidates are taken).
A row's logits do not depend on the other rows (the kernel sums every row in one order), so its
candidates change only where a batch crosses the row limit, and its token only if the best token
were then outside one of the two candidate sets.
"""

from __future__ import annotations

import torch
from rillet.core.quant import avx2_kernel, rows_kernel
from rillet.core.quant.minmax import minmax_int4

ROWS_PER_THREAD = 4  # rows a torch thread up to which this pass is taken (measured above)
MAX_ROWS = 12  # the kernel's rows per pass over the weights: a 13th row unpacks them all again
AVX2_MAX_ROWS = 64  # rows up to which the AVX2 kernel's pass is taken: 2-4x faster at 1-16 rows
_CHUNK = 4096  # head rows quantized at a time: no float32 copy of the whole head at load


class Int4Candidates:
    """Approximate logits of a group-32 int8 head, requantized to int4: x [M, K] -> float32 [M, N].
    Not an nn.Module buffer: built from the int8 codes at load, never saved."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, avx2: bool = False) -> None:
        """codes [N, K/G, G] int8 and scales [N, K/G] float32 (Int8Weight's); avx2: laid out for
        rillet's AVX2 kernel, else for its AVX512-BF16 one."""
        n = codes.shape[0]
        self.out_features = n
        self.avx2 = avx2
        pack = avx2_kernel.pack if avx2 else rows_kernel.pack
        packed, sz = [], []
        for lo in range(0, n, _CHUNK):  # _CHUNK is a multiple of the kernel's 32-column tiles
            g = codes[lo : lo + _CHUNK].float() * scales[lo : lo + _CHUNK, :, None]  # [rows, K/G, G]
            p, s = pack(*minmax_int4(g))
            packed.append(p)
            sz.append(s)
        self._packed = torch.cat(packed)  # the kernel's layout (a chunk is whole blocks of either)
        self._sz = torch.cat(sz)

    def takes(self, rows: int) -> bool:
        """Whether a batch of `rows` is cheaper through this pass than through oneDNN's."""
        if self.avx2:
            return rows <= AVX2_MAX_ROWS
        return rows <= min(ROWS_PER_THREAD * torch.get_num_threads(), MAX_ROWS)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] any float -> [M, N] float32
        if self.avx2:
            return avx2_kernel.mm(x.float().contiguous(), self._packed, self._sz, self.out_features).float()
        y = rows_kernel.mm(x.to(torch.bfloat16).contiguous(), self._packed, self._sz, self.out_features)
        return y.float()


def build(codes: torch.Tensor, scales: torch.Tensor) -> Int4Candidates | None:
    """An Int4Candidates for this head where one of rillet's int4 kernels runs and takes its
    shape, else None."""
    n, groups, group = codes.shape
    if rows_kernel.runs(codes.device.type, n, groups * group):
        return Int4Candidates(codes, scales)
    if avx2_kernel.runs(codes.device.type, n, groups * group):
        return Int4Candidates(codes, scales, avx2=True)
    return None
