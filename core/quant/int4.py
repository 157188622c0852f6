"""Weight-only int4 (group 32, asymmetric) for CPU decode: 8x fewer weight bytes than fp32.

A CPU decode step is memory-bound: every weight is read once per step, so bytes per weight set the
speed. Each group of 32 input-channel weights keeps a scale and a zero point (bf16) and 4-bit codes
q in [0, 15]; w = (q - 8) * scale + zero, torch's `_weight_int4pack_mm_for_cpu` layout. The codes
come from min/max rounding per group, which is lossless for weights that came from a GGUF Q4_1
file: Q4_1 itself maps each block's min to q = 0 and max to q = 15 (x = q * d + min), so the
same (d, min) and codes come back; only d and min are rounded to bf16. The LM head is not a Q4_1
tensor in the default file (it is the Q8_0 embedding): it gets group-32 int8 (`Int8Weight`).

The matmul operands are bf16 whatever the model's dtype: torch's CPU kernels for these layouts are
fast only for bf16 activations (measured here: their float32 and float16 variants run 10-50x slower
than bf16, slower than a dense float32 matmul). In a float32 model each projection's input is cast
to bf16 and its bf16 output is widened by the arithmetic that consumes it (type promotion, exact),
so only the operands are rounded, the way llama.cpp quantizes activations only as matmul operands;
the residual stream, norms, RoPE, attention and logits stay float32 (see core/model).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from rillet.core.quant import avx2_kernel, candidate_head, int4_candidates, rows_kernel
from rillet.core.quant.candidate_head import CandidateHead
from rillet.core.quant.int4_candidates import Int4Candidates
from rillet.core.quant.minmax import minmax_int4
from torch import nn

GROUP = 32
REFINE_TOP_K = 16  # logits per row that Int8Weight.refine recomputes in float32
_HEAD_ROWS = 4096  # rows of the LM head quantized at a time (Int8Weight)
ROW_BLOCK = 4  # activation rows the CPU int8 kernel takes per pass over the weights (Int8Weight)


def int4_supported() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def _pack(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes [N, K/G, G] in [0, 15], scale and zero [N, K/G] -> the kernel's (packed weight,
    [K/G, N, 2] bf16 scales-and-zeros), for w = (q - 8) * scale + zero."""
    n, k = codes.shape[0], codes.shape[1] * codes.shape[2]
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).view(n, k), 1)
    return packed, torch.stack([scale.t(), zero.t()], -1).to(torch.bfloat16).contiguous()


def _groups(weight: torch.Tensor) -> torch.Tensor:  # [N, K] -> [N, K/G, G] float32
    n, k = weight.shape
    if k % GROUP:
        raise ValueError(f"int4: input dim {k} is not a multiple of {GROUP}")
    return weight.detach().float().reshape(n, k // GROUP, GROUP)


class Int4Weight(nn.Module):
    """Stands in for a [N, K] weight matrix; `lin(x, w, b)` dispatches on it. Its codes are laid
    out for rillet's own kernel (rows_kernel.py) where that runs here and the shape fits, else for
    its AVX2 one (avx2_kernel.py, int8 activations) where that runs, else for torch's
    `_weight_int4pack_mm_for_cpu` (`aten`): the same weights either way. `rows` and `avx2` left
    None choose by the CPU; `rows=False` alone asks for torch's layout.

    Where the CPU has AMX tiles the codes are kept in torch's layout too (`aten_packed`, ~half a
    byte a weight more): rillet's kernel multiplies several rows through the tiles for little
    more than one, but at one row the small-batch step through torch's kernel was faster (5.6
    against 6.6 ms a step on the default model, bench/RESULTS.md 2026-12-04), so that step is
    traced with `use_aten` set (DecoderModel.torch_int4_kernel) and the others are not."""

    packed: torch.Tensor  # aten: [N, K/2] uint8; rows: [N/32, K/32, 16, 32]; avx2: [N/8, K/32, 4, 32]
    scales_zeros: torch.Tensor  # aten: [K/G, N, 2] bf16; rows: [N/32, K/32, 2, 32]; avx2: [N/8, K/32, 2, 8]
    aten_packed: torch.Tensor | None  # rows with an aten copy: torch's layout beside (else None)
    aten_scales_zeros: torch.Tensor | None

    def __init__(
        self,
        weight: torch.Tensor,
        rows: bool | None = None,
        aten_copy: bool | None = None,
        avx2: bool | None = None,
    ) -> None:
        super().__init__()
        codes, scale, zero = minmax_int4(_groups(weight))
        self.out_features, self.in_features = weight.shape
        self.avx2 = _takes_avx2(weight, rows, avx2)
        if self.avx2:
            rows = False
        elif rows is None:
            rows = rows_kernel.runs(weight.device.type, *weight.shape)
        elif rows and not (rows_kernel.fits(*weight.shape) and rows_kernel.available()):
            raise ValueError(f"int4: rillet's kernel cannot take a {tuple(weight.shape)} weight here")
        self.rows = rows
        self.use_aten = False  # rows: call torch's kernel on the aten copy (a trace of the small step)
        pack = rows_kernel.pack if rows else avx2_kernel.pack if self.avx2 else _pack
        packed, scales_zeros = pack(codes, scale, zero)
        self.register_buffer("packed", packed)
        self.register_buffer("scales_zeros", scales_zeros)
        if aten_copy is None:
            aten_copy = rows_kernel.keeps_aten_copy()
        copy = _pack(codes, scale, zero) if rows and aten_copy else (None, None)
        self.register_buffer("aten_packed", copy[0])
        self.register_buffer("aten_scales_zeros", copy[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] any float -> [..., N] bf16
        if self.avx2:  # it quantizes float32 inputs itself (to int8): no bf16 rounding first
            flat = x.reshape(-1, self.in_features)
            flat = flat if flat.dtype in (torch.float32, torch.bfloat16) else flat.float()
            y = avx2_kernel.mm(flat, self.packed, self.scales_zeros, self.out_features)
            return y.view(*x.shape[:-1], self.out_features)
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        aten_copy = self.use_aten and self.aten_packed is not None
        if self.rows and not aten_copy:
            y = rows_kernel.mm(flat, self.packed, self.scales_zeros, self.out_features)
        else:
            packed, sz = (
                (self.aten_packed, self.aten_scales_zeros) if aten_copy else (self.packed, self.scales_zeros)
            )
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, packed, GROUP, sz)
        return y.view(*x.shape[:-1], self.out_features)


def _takes_avx2(weight: torch.Tensor, rows: bool | None, avx2: bool | None) -> bool:
    """Whether an Int4Weight goes through rillet's AVX2 kernel: asked for (where it cannot, an
    error), or by the CPU where neither kernel was named and the AVX512-BF16 one does not run."""
    device, shape = weight.device.type, weight.shape
    if avx2 is None:
        return rows is None and not rows_kernel.runs(device, *shape) and avx2_kernel.runs(device, *shape)
    if avx2 and (rows or not (avx2_kernel.fits(*shape) and avx2_kernel.available())):
        raise ValueError(f"int4: rillet's AVX2 kernel cannot take a {tuple(shape)} weight here")
    return avx2


class Int4Experts(nn.Module):
    """Stands in for a stack of expert matrices [E, N, K]: each expert an Int4Weight, their packed
    codes [E, N, K/2] and scales [E, K/G, N, 2] stacked (the MoE dispatch op takes them whole)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        experts = [Int4Weight(w, rows=False) for w in weight]  # the MoE dispatch op reads aten's layout
        self.num_experts, self.out_features, self.in_features = weight.shape
        self.register_buffer("packed", torch.stack([e.packed for e in experts]))
        self.register_buffer("scales_zeros", torch.stack([e.scales_zeros for e in experts]))


def int4_expert_mm(
    x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, e: int
) -> torch.Tensor:  # x [M, K] any float -> [M, N] bf16, with expert e of an Int4Experts' buffers
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed[e], GROUP, scales_zeros[e])
    return out  # type: ignore[no-any-return]


class Int8Weight(nn.Module):
    """The LM head: weight-only int8 with one scale per output row, plus `refine`, which redoes each
    row's top `REFINE_TOP_K` logits exactly in float32.

    The head of the default GGUF is its Q8_0 token embedding (one scale per group of 32). Per-row
    int8 reads half the bytes of bf16 through torch's fast kernel, but its logits are off by ~0.2
    (4x the error of bf16 operands): used alone it changed 1 greedy answer in 8 on
    tests/data/chat_prompts.json, and int4 changed more ("What is the capital of France?" stopped
    saying Paris). So it only picks candidates: `refine` recomputes the top k of each row from the
    float32 hidden state and group-32 int8 codes, which give back a Q8_0 tensor's own codes and
    scales exactly, and writes them back. The greedy choice is then the float32 head's whenever the
    best token is among the k, and the leading candidates of a sampled row carry exact logits.
    """

    codes: torch.Tensor  # [N, K/G, G] int8
    scales: torch.Tensor  # [N, K/G] float32

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        n, k = weight.shape
        self.out_features, self.in_features = n, k
        row_codes = torch.empty(n, k, dtype=torch.int8, device=weight.device)
        row_scales = torch.empty(n, dtype=torch.float32, device=weight.device)
        codes = torch.empty(n, k // GROUP, GROUP, dtype=torch.int8, device=weight.device)
        scales = torch.empty(n, k // GROUP, dtype=torch.float32, device=weight.device)
        # a few thousand rows at a time: the float32 temporaries of a whole vocabulary-sized head
        # (two of its size) would be the peak of the whole load (elementwise per row: same codes)
        for lo in range(0, n, _HEAD_ROWS):
            w = weight[lo : lo + _HEAD_ROWS].detach().float()  # [rows, K]
            scale = (w.abs().amax(1) / 127).clamp(min=1e-12)  # [rows]
            row_codes[lo : lo + len(w)] = (w / scale[:, None]).round_().clamp_(-127, 127)
            row_scales[lo : lo + len(w)] = scale
            g = _groups(w)  # [rows, K/G, G]
            s = (g.abs().amax(-1) / 127).clamp(min=1e-12)  # [rows, K/G]
            codes[lo : lo + len(w)] = (g / s[..., None]).round_().clamp_(-127, 127)
            scales[lo : lo + len(w)] = s
        self.register_buffer("row_codes", row_codes)
        self.register_buffer("row_scales", row_scales.to(torch.bfloat16))
        self.register_buffer("codes", codes)
        self.register_buffer("scales", scales)
        # plain greedy rows pick their candidates through oneDNN where it sums exactly (candidate_head.py),
        # few of them through an int4 copy where rillet's kernel runs (int4_candidates.py)
        self.candidate_head: CandidateHead | None = candidate_head.build(row_codes, row_scales)
        self.int4_candidates: Int4Candidates | None = int4_candidates.build(codes, scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] any float -> [..., N] bf16
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)  # [M, K]
        m = flat.shape[0]
        whole = m - m % ROW_BLOCK
        if flat.device.type == "cpu" and m > ROW_BLOCK and m != whole:
            # The CPU kernel goes through the head once per block of 4 rows, and a part block
            # that rides along costs it about a whole pass (measured, 2 threads: 5 rows 3.1 ms,
            # 4 + 1 in two calls 2.5; 9 rows 4.7, 8 + 1 4.1): the rest goes in a call of its own.
            # Each row's logits are bitwise the same either way (tests/core/quant).
            y = torch.cat([self._mm(flat[:whole]), self._mm(flat[whole:])])
        else:
            y = self._mm(flat)
        return y.view(*x.shape[:-1], self.out_features)

    def _mm(self, flat: torch.Tensor) -> torch.Tensor:  # [M, K] bf16 -> [M, N] bf16
        return torch.ops.aten._weight_int8pack_mm(flat, self.row_codes, self.row_scales)

    def refine(self, x: torch.Tensor, y: torch.Tensor, k: int = REFINE_TOP_K) -> torch.Tensor:
        """x [B, K] hidden, y [B, N] float32 logits from self(x) -> y with each row's top k exact."""
        top = y.topk(min(k, self.out_features), dim=-1).indices  # [B, k]
        return y.scatter(1, top, self._exact(x, top))

    def candidate_logits(self, x: torch.Tensor, k: int = REFINE_TOP_K) -> torch.Tensor:
        """x [B, K] hidden -> [B, N] float32: each row's top k candidates with their exact logits,
        every other token -inf. For rows that read only the argmax: it is the exact head's whenever
        the best token is among the k, and it depends only on the row (no approximate logit is
        left to win it)."""
        top, exact = self._candidates(x, k)
        rows = torch.full((len(x), self.out_features), float("-inf"), dtype=torch.float32, device=x.device)
        return rows.scatter_(1, top, exact)

    def candidate_tokens(
        self, x: torch.Tensor, cap: float | None = None, k: int = REFINE_TOP_K
    ) -> torch.Tensor:
        """x [B, K] hidden -> [B] long: candidate_logits(x)'s argmax (after the soft cap `cap`,
        tanh(l / cap) * cap) without its [B, N] rows of -inf around the k (a row of 49,152 costs
        ~0.09 ms to fill and scan, 9 rows ~0.3). Among equal best logits the lowest token id, as
        argmax takes the first."""
        top, exact = self._candidates(x, k)
        if cap is not None:
            exact = torch.tanh(exact / cap) * cap
        best = exact.amax(-1, keepdim=True)
        return torch.where(exact == best, top, self.out_features).amin(-1)

    def _candidates(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, K] -> each row's top k token ids [B, k] by the approximate logits, and their exact
        float32 logits [B, k]."""
        approx = self.approximate(x)
        top = approx.topk(min(k, self.out_features), dim=-1).indices  # [B, k]
        return top, self._exact(x, top)

    def approximate(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, K] -> [B, N] float32 logits that only pick candidates: the int4 copy's for few rows,
        else oneDNN's int8 GEMM, else the bf16 kernel's."""
        if self.int4_candidates is not None and self.int4_candidates.takes(len(x)):
            return self.int4_candidates(x)
        return self(x).float() if self.candidate_head is None else self.candidate_head(x)

    def _exact(self, x: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
        """x [B, K], token ids top [B, k] -> their float32 logits [B, k] from the group-32 codes.
        A product and a sum over the last dim, not a batched matmul: each logit is then summed in
        the same order whatever B is. A bmm goes to MKL, whose strict mode keeps a row's bits only
        from 4 rows up (core/determinism/mkl.py): deterministic mode's request tests failed on an
        AMX Xeon, a row alone and in a batch of 17 differing in the last bits of its logits."""
        rows = self.codes[top].float() * self.scales[top][..., None]  # [B, k, K/G, G]
        return (rows.flatten(2) * x.float()[:, None, :]).sum(-1)  # [B, k]


def lin(x: torch.Tensor, w: torch.Tensor | nn.Module, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T (+ b). A stand-in module (Int4Weight, Int8Weight, deterministic mode's
    RowPaddedWeight in core/determinism/dense.py) computes the product itself."""
    if isinstance(w, nn.Module):
        y = w(x)
        return y if b is None else y + b  # the bias added in the model's dtype
    return F.linear(x, w, b)


def quantize_module_weights(module: nn.Module, names: tuple[str, ...]) -> None:
    """Replaces the named 2-D (3-D: stacked experts) parameters of `module` by Int4Weight
    (Int4Experts) stand-ins, in place."""
    for name in names:
        param = getattr(module, name)
        if isinstance(param, Int4Weight | Int4Experts) or param is None:
            continue
        q = Int4Experts(param.data) if param.dim() == 3 else Int4Weight(param.data)
        delattr(module, name)
        setattr(module, name, q)
