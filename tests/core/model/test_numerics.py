"""The default CPU numerics do not depend on the CPU's kernels: run under several ISA caps.

oneDNN and ATen pick kernels by CPU feature (AVX-512 with or without bf16 dot products, AMX, AVX2),
and the bf16 ones round differently. bench/engine/numerics_agreement.py runs in a subprocess per cap, so any
x86 machine exercises more than one kernel path, and each run must show that the default path
(int4 weights, bf16 matmul operands, float32 elsewhere, an exact-top-k LM head):
  - answers the France question with Paris, greedy;
  - is closer to the float32 model than transformers in bf16 is to transformers in float32, on
    the same prompts, weights and kernels: smaller mean logit error and at least as many argmax
    agreements under teacher forcing along the float32 answers (whole-answer equality over a
    handful of prompts is decided by one early near-tie, too coarse for a test; the benchmark
    reports it over all 48 prompts).
The same default config over an int8 KV pool (`cache.dtype: int8`, a variant run in the same
subprocess) must agree under teacher forcing at least as often as transformers bf16 (its France
answer is not checked: the first token is a near-tie, "The" against "L'" 0.064 nats apart with a
float pool and 0.012 with int8 on an AMX Xeon through rillet's int4 kernel, which then answers
"L'Étoile..." while its logits are closer to float32 than torch's kernel's, 2026-12-04); its
mean logit error is held within INT8_ERR_MARGIN of transformers bf16's, not below it:
int8 rounding of K/V alone moves it by about +-0.006 (four equivalent Hadamard rotations gave
0.104-0.117 against bf16's 0.109 on these 16 prompts), so "below" would be a coin flip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from repo import REPO
from rillet.core.quant.int4 import int4_supported

# minutes on one core: its module is queued first under --dist loadfile (tests/conftest.py)
pytestmark = pytest.mark.slow

CAPS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
# Both runs answer through the eager decode step. The compiled step (as served) is checked
# against eager token for token in tests/graphs/test_compiled_decode.py (the default model);
# compiling it here as well cost the suite another cold compile (~110 s): the same graph compiled
# in this subprocess and in pytest's process got two Inductor cache entries (their generated code
# differs only in the AOT id, i.e. the process's count of compiles), so neither finds the other.
DECODE = {"native": ["--set", "graphs.enabled=off"], "avx2": ["--set", "graphs.enabled=off"]}
INT8 = "cache.dtype=int8"
INT8_ERR_MARGIN = 1.15


@pytest.mark.skipif(not int4_supported(), reason="no CPU int4 kernel in this torch")
@pytest.mark.timeout(1200)  # three rillet runs and two transformers runs; a loaded box doubles it
@pytest.mark.parametrize("cap", list(CAPS))
def test_default_numerics_stay_close_to_float32_under_isa_cap(cap: str, tmp_path: Path) -> None:
    if cap != "native" and not torch.cpu._is_avx512_supported():
        pytest.skip("the CPU has AVX2 at most: the native run is this cap's run")
    out = tmp_path / "agreement.json"
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    args = ["--prompts", "16", "--tokens", "24", "--quick", "--out", str(out), *DECODE[cap]]
    args += ["--variant", INT8]
    r = subprocess.run(
        [sys.executable, "-m", "bench.engine.numerics_agreement", *args],
        cwd=REPO,
        env=env | CAPS[cap],
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["isa_caps"] == {k: CAPS[cap].get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    assert res["default_run"] == "int4/float32" and res["fp32_run"] == "none/float32"
    assert res["default_decode"] == "eager"
    assert "Paris" in res["default_france"], res["default_france"]
    ours, theirs = res["default_forced"], res["hf_bf16_forced"]
    assert ours["mean_abs_logit_err"] < theirs["mean_abs_logit_err"], res
    assert ours["argmax_agree"] >= theirs["argmax_agree"], res
    int8 = res["variants"][INT8]
    assert int8["run"] == "int4/float32" and int8["decode"] == "eager"
    assert int8["forced"]["argmax_agree"] >= theirs["argmax_agree"], res
    assert int8["forced"]["mean_abs_logit_err"] < INT8_ERR_MARGIN * theirs["mean_abs_logit_err"], res
