"""The LM head's candidate pass for rows that read only their argmax: int8 x int8 through oneDNN.
(Batches of few rows take an int4 copy of the head where rillet's kernel runs: int4_candidates.py.)

A plain greedy row (no penalties, bias, logprobs, min_tokens mask or grammar: the sampler takes
only the argmax) needs from the head only which tokens could be the best; `Int8Weight` then
computes those exactly. torch's weight-only int8 kernel (`_weight_int8pack_mm`, bf16 activations)
goes over the 49,152 x 576 head once per block of 4 rows and is compute-bound past one row; oneDNN's
int8 GEMM (the op torch's x86 quantization lowers to; VNNI / AMX int8) reads the same int8 codes
once for any number of rows. With the exact top 16, out of cache, 2 threads: 1 / 4 / 9 rows cost
2.2 / 3.3 / 6.4 ms through the first, 1.5 / 1.6 / 2.2 through this (bench/kernels/lm_head.py).

The activations are quantized per row: each row is divided by its largest magnitude and rounded to
127 levels a side (uint8 around 128), the one scale 1/127 for every row, and its logits are scaled
back by that magnitude. So a row's logits are bitwise the same alone or in any batch
(tests/core/quant/test_candidate_head.py). They are off by ~0.12 on average (the bf16 kernel's:
~0.06), so they only pick candidates and never reach a sampled distribution.

Only where the products are exact: without VNNI (AVX2, AVX-512 before Cascade Lake) oneDNN sums
u8 x s8 pairs in int16 and saturates; forced onto AVX2 here (`ONEDNN_MAX_CPU_ISA=AVX2`) the head's
logits were off by up to 11.9. So `build` runs the head once on a probe whose every pair saturates
such a kernel and keeps it only if the result is exact; otherwise the bf16 kernel picks candidates.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

_LEVELS = 127.0  # quantized magnitudes a side of zero
_ZERO = 128  # uint8 zero point


def onednn_int8_available(device: torch.device) -> bool:
    onednn = getattr(torch.ops, "onednn", None)
    return (
        device.type == "cpu" and hasattr(onednn, "qlinear_pointwise") and torch.backends.mkldnn.is_available()
    )


class CandidateHead:
    """Approximate logits of an int8 head with one scale per output row: codes [N, K] int8,
    scales [N] -> float32 [M, N] for hidden rows [M, K]. Holds oneDNN's packed copy of the codes
    (N x K bytes more); not an nn.Module buffer: built from the codes, never saved."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor) -> None:
        n = codes.shape[0]
        self._packed = torch.ops.onednn.qlinear_prepack(codes.contiguous(), None)
        self._scales = scales.float().contiguous()  # [N]
        self._zeros = torch.zeros(n, dtype=torch.int64)  # symmetric weights

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] any float -> [M, N] float32
        x = x.float()
        peak = x.abs().amax(1, keepdim=True).clamp(min=1e-30)  # [M, 1]
        q = (x * (_LEVELS / peak)).round_().add_(_ZERO).to(torch.uint8)  # [M, K] in [1, 255]
        y = torch.ops.onednn.qlinear_pointwise(
            q, 1.0 / _LEVELS, _ZERO, self._packed, self._scales, self._zeros,
            None, 1.0, 0, torch.float32, "none", [], "",
        )  # fmt: skip
        return y.mul_(peak)  # type: ignore[no-any-return]


def build(codes: torch.Tensor, scales: torch.Tensor) -> CandidateHead | None:
    """A CandidateHead for this head where oneDNN's int8 GEMM runs and sums exactly, else None."""
    if not onednn_int8_available(codes.device):
        return None
    head = CandidateHead(codes, scales)
    # Every input at its top level (u8 255) against the head's own codes: a kernel that sums pairs
    # in int16 saturates wherever two neighbouring codes add up past 128, which a vocabulary-sized
    # head has; exact sums differ from the float ones only by rounding.
    probe = torch.ones(1, codes.shape[1])
    # integer sums (no float copy of the head at load): [N]
    exact = codes.sum(1, dtype=torch.int64).double() * scales.double()
    bound = 1e-4 * codes.abs().sum(1, dtype=torch.int64).double() * scales.double() + 1e-6
    if not bool(((head(probe)[0].double() - exact).abs() <= bound).all()):
        log.warning("oneDNN's int8 GEMM does not sum exactly on this CPU: greedy rows use the full LM head")
        return None
    return head
