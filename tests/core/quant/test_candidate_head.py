"""The LM head's candidate pass for plain greedy rows (core/quant/candidate_head.py): the exact
top k alone, a row's bits independent of its batch, the same argmax as the full head."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from rillet.core.quant.candidate_head import CandidateHead, onednn_int8_available
from rillet.core.quant.int4 import Int8Weight, int4_supported

pytestmark = [
    pytest.mark.isa,  # run again under an AVX2 cap (tests/test_isa_cap.py)
    pytest.mark.skipif(not int4_supported(), reason="no CPU int8 head kernel in this torch"),
]
ONEDNN = onednn_int8_available(torch.device("cpu"))
needs_onednn = pytest.mark.skipif(not ONEDNN, reason="no oneDNN int8")


def _head(n: int = 2048, k: int = 96, seed: int = 0) -> Int8Weight:
    return Int8Weight(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05)


# the candidate pass runs here: oneDNN is there and sums exactly on this CPU (candidate_head.build's
# probe, on a head of the default model's width, where a saturating kernel shows)
EXACT_INT8 = int4_supported() and _head(4096, 576).candidate_head is not None
needs_exact_int8 = pytest.mark.skipif(not EXACT_INT8, reason="no exact oneDNN int8 GEMM here")


def _exact(head: Int8Weight, x: torch.Tensor) -> torch.Tensor:  # [M, N] float64: the Q8_0 weights' logits
    w = (head.codes.double() * head.scales.double()[..., None]).flatten(1)
    return x.double() @ w.t()


@pytest.mark.skipif(
    not (ONEDNN and (torch.cpu._is_vnni_supported() or torch.cpu._is_amx_tile_supported()))
    or "ONEDNN_MAX_CPU_ISA" in os.environ,  # oneDNN held below the CPU's own ISA
    reason="no oneDNN int8, or no VNNI / AMX for it on this CPU",
)
def test_the_candidate_head_runs_where_the_cpu_sums_int8_exactly() -> None:
    assert _head().candidate_head is not None


@needs_onednn
def test_a_kernel_that_does_not_sum_exactly_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """One logit of the probe off (as an int16-saturating kernel puts many): no candidate pass."""
    real = CandidateHead.__call__

    def saturating(self: CandidateHead, x: torch.Tensor) -> torch.Tensor:
        y = real(self, x)
        y[0, 5] -= 1.0
        return y

    monkeypatch.setattr(CandidateHead, "__call__", saturating)
    head = _head()
    assert head.candidate_head is None
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(4))
    assert torch.equal(head.candidate_logits(x).argmax(-1), head.refine(x, head(x).float()).argmax(-1))


@pytest.mark.skipif(not (ONEDNN and torch.cpu._is_avx2_supported()), reason="no oneDNN int8 or no AVX2")
def test_without_vnni_onednn_saturates_and_the_probe_refuses_it() -> None:
    """oneDNN held to AVX2 (no VNNI: u8 x s8 pairs summed in int16) gets the head's logits wrong,
    and the start-up probe sees it: the real kernel, in a process of its own."""
    code = (
        "import torch\n"
        "from rillet.core.quant.int4 import Int8Weight\n"
        "w = torch.randn(4096, 576, generator=torch.Generator().manual_seed(0)) * 0.05\n"
        "print(Int8Weight(w).candidate_head is None)\n"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


@pytest.mark.parametrize("onednn", [True, False])
def test_candidate_logits_are_the_exact_top_k_and_minus_inf_elsewhere(onednn: bool) -> None:
    head = _head()
    head.int4_candidates = None  # tests/core/quant/test_int4_candidates.py
    if not onednn:
        head.candidate_head = None  # the bf16 kernel picks them
    elif head.candidate_head is None:
        pytest.skip("no candidate pass on this CPU")
    x = torch.randn(7, 96, generator=torch.Generator().manual_seed(1))
    got = head.candidate_logits(x, k=8)
    exact = _exact(head, x)
    finite = got.isfinite()
    assert (finite.sum(1) == 8).all() and (got[~finite] == float("-inf")).all()
    torch.testing.assert_close(got[finite].double(), exact[finite], rtol=1e-6, atol=1e-6)
    assert torch.equal(got.argmax(-1), exact.argmax(-1))
    assert torch.equal(got.argmax(-1), head.refine(x, head(x).float()).argmax(-1))


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("cap", [None, 0.5])
def test_candidate_tokens_are_the_candidate_logits_argmax(onednn: bool, cap: float | None) -> None:
    """DecoderModel.greedy_tokens' path: the argmax without the rows of -inf, soft-capped as
    compute_logits caps; equal best logits give the lowest token id, as argmax does."""
    w = torch.randn(2048, 96, generator=torch.Generator().manual_seed(2)) * 0.05
    w[1500] = w[700]  # two tokens with the same codes: equal logits
    head = Int8Weight(w)
    head.int4_candidates = None  # tests/core/quant/test_int4_candidates.py
    if not onednn:
        head.candidate_head = None
    elif head.candidate_head is None:
        pytest.skip("no candidate pass on this CPU")
    x = torch.randn(9, 96, generator=torch.Generator().manual_seed(3))
    x[4] = w[700] * 40  # its best token is 700 = 1500
    logits = head.candidate_logits(x)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    got = head.candidate_tokens(x, cap=cap)
    assert got.dtype == torch.int64 and torch.equal(got, logits.argmax(-1))
    assert got[4] == 700


@needs_exact_int8
def test_a_rows_approximate_logits_are_the_same_bits_in_any_batch() -> None:
    """Each row is quantized on its own scale: its logits do not depend on the other rows, their
    count, or its place among them (the speculative verify step computes a run's positions in
    rounds, and a plain step in any batch)."""
    head = _head()
    cand = head.candidate_head
    assert cand is not None
    g = torch.Generator().manual_seed(2)
    x = torch.randn(13, 96, generator=g) * torch.logspace(-2, 1, 13)[:, None]  # rows of very different size
    alone = torch.cat([cand(x[i : i + 1]) for i in range(13)])
    for m in (2, 4, 5, 9, 13):
        assert torch.equal(cand(x[:m]), alone[:m])
    perm = torch.randperm(13, generator=g)
    assert torch.equal(cand(x[perm]), alone[perm])


@needs_exact_int8
def test_its_error_is_a_small_share_of_the_logits_range() -> None:
    """Per-row 8-bit activations on int8 weights: well inside the spread that candidates are picked
    from (the default model's head: ~0.12 mean error, bench/RESULTS.md)."""
    head = _head(n=4096, k=576)
    x = torch.randn(16, 576, generator=torch.Generator().manual_seed(3))
    exact = _exact(head, x)
    err = (CandidateHead(head.row_codes, head.row_scales.float())(x).double() - exact).abs()
    spread = exact.std(1, keepdim=True)
    assert (err.mean(1, keepdim=True) < 0.02 * spread).all()
    assert (err < 0.1 * spread).all()


def test_on_the_default_models_hidden_states_the_argmax_is_the_full_heads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default model's Q8_0 head over its own hidden states (greedy answers to chat prompts):
    the candidates' argmax is the one the full head (bf16 kernel + refine) gives, row for row."""
    from rillet.core.config import config_from_dict
    from rillet.core.llm import LLM
    from rillet.core.model.decoder import DecoderModel
    from rillet.core.sampling_params import SamplingParams

    rows: list[torch.Tensor] = []
    real = DecoderModel.compute_logits

    real_greedy = DecoderModel.greedy_tokens

    def spy(self: DecoderModel, hidden: torch.Tensor) -> torch.Tensor:
        rows.append(hidden.detach().clone())
        return real(self, hidden)

    def spy_greedy(self: DecoderModel, hidden: torch.Tensor) -> torch.Tensor:  # plain greedy rows
        rows.append(hidden.detach().clone())
        return real_greedy(self, hidden)

    monkeypatch.setattr(DecoderModel, "compute_logits", spy)
    monkeypatch.setattr(DecoderModel, "greedy_tokens", spy_greedy)
    cfg = config_from_dict({"model": {"quantization": "int4"}, "graphs": {"enabled": False}})
    prompts = ["Write a haiku about the sea.", "List three uses of copper.", "What is 17 * 3?"]
    with LLM(cfg) as llm:
        llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0))
        head = llm.engine.core.runner.model.quant_head  # type: ignore[attr-defined]
    assert head is not None
    x = torch.cat(rows)
    assert len(x) >= 24
    want = head.refine(x, head(x).float()).argmax(-1)
    assert torch.equal(head.candidate_logits(x).argmax(-1), want)
    assert torch.equal(head.candidate_tokens(x), want)
    # a few rows at a time: the int4 candidate pass where rillet's kernel runs (int4_candidates.py)
    assert torch.equal(torch.cat([head.candidate_tokens(x[i : i + 4]) for i in range(0, len(x), 4)]), want)


@pytest.mark.parametrize("spec", ["off", "ngram"])
def test_the_engines_greedy_tokens_from_candidates_are_the_logits_argmax(
    monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    """Plain greedy rows take DecoderModel.greedy_tokens (no [rows, vocab] logits); the answers
    are those of the logits' argmax, in plain and in speculative verify steps."""
    from rillet.core.config import config_from_dict
    from rillet.core.llm import LLM
    from rillet.core.model.decoder import DecoderModel
    from rillet.core.sampling_params import SamplingParams

    tiny = {"kind": "shape", "shape": "tiny", "device": "cpu", "quantization": "int4"}
    speculative = {"method": spec, "max_batch": 4, "row_cost": 0.0}
    cfg = config_from_dict({"model": tiny, "graphs": {"enabled": False}, "speculative": speculative})
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11] * 4, [3, 1, 4, 1, 5, 9, 2, 6]]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    calls: list[int] = []
    real = DecoderModel.greedy_tokens

    def counted(self: DecoderModel, hidden: torch.Tensor) -> torch.Tensor:
        calls.append(len(hidden))
        return real(self, hidden)

    def run() -> list[list[int]]:
        with LLM(cfg) as llm:
            assert llm.engine.core.runner.model.quant_head is not None  # type: ignore[attr-defined]
            return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]

    monkeypatch.setattr(DecoderModel, "greedy_tokens", counted)
    fast = run()
    assert calls  # the plain greedy rows took it
    # the path before greedy_tokens: the argmax of the candidates' [rows, vocab] logits
    monkeypatch.setattr(
        DecoderModel, "greedy_tokens", lambda self, h: self.quant_head.candidate_logits(h).argmax(-1)
    )
    assert run() == fast
