"""The ISA-sensitive tests (marked `isa`) run again under an AVX2 cap, in a child pytest.

ATen, oneDNN, MKL, Inductor and rillet's own kernels pick their code by the CPU's vector
extensions, and bf16 and float32 sums round differently with each. A test written on an AVX-512
machine can hold there only, and a CPU with AVX2 alone (AMD Zen 3, the commonest x86 server
class) then failed it (issue 68: a compiled step's K/V compared bit for bit with eager's). So on
every machine with more than AVX2, `make test` also runs what AVX2 runs:
  - ATEN_CPU_CAPABILITY=avx2: ATen's kernels and Inductor's vectorised loops for 256-bit vectors
    (Inductor picks its ISA from ATen's cap: torch/_inductor/cpu_vec_isa.py), and rillet's
    AVX-512 kernels gated off as where the CPU lacks them (they follow ATen's capability:
    core/quant/rows_kernel.py, core/attention/cpu_kernel.py);
  - ONEDNN_MAX_CPU_ISA and MKL_ENABLE_INSTRUCTIONS: oneDNN's and MKL's GEMMs for AVX2.
That is the selection an AVX2-only CPU makes (the failure of issue 68 reproduces under it: the
compiled step's 256-bit reductions round otherwise than eager's). Where ATen's capability already
is AVX2 or lower, the whole suite ran there and this test is skipped.

Marked `isa`: the modules whose results depend on a vectorised or compiled path (kernels and
their fallbacks, compiled against eager, batch invariance, quantized matmuls), kept to the fast
ones; the default model's numerics run under both caps in tests/core/model/test_numerics.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from repo import REPO

pytestmark = pytest.mark.slow  # queued first under --dist loadfile (tests/conftest.py)

AVX2_CAP = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def capped() -> bool:
    """Whether this process already runs at most what an AVX2 CPU runs."""
    return torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "AVX2")


@pytest.mark.skipif(capped(), reason="ATen's capability is AVX2 or lower here: the suite ran under it")
@pytest.mark.timeout(1500)
def test_isa_sensitive_tests_pass_under_an_avx2_cap(request: pytest.FixtureRequest) -> None:
    # one torch thread, as an xdist worker has (tests/conftest.py); no xdist in the child
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | AVX2_CAP
    env["OMP_NUM_THREADS"] = "1"
    # beside this process's Inductor cache, never in it (tests/conftest.py: one folder per cap)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).parent / "isa-avx2")
    args = ["-q", "-m", "isa", "-p", "no:cacheprovider", "-p", "no:xdist", *_isa_modules(request.session)]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1400,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert " passed" in r.stdout.splitlines()[-1]


def _isa_modules(session: pytest.Session) -> list[str]:
    """The modules holding a test marked `isa` among what this session collected (the whole suite
    under `make test`, an xdist worker included): the child collects those alone, not the whole
    tree (~20 s of one core's time, importing every test module to deselect it). Run without
    them (this file alone), the child collects the whole tree and selects by the mark as before."""
    return sorted({item.nodeid.split("::", 1)[0] for item in session.items if item.get_closest_marker("isa")})
