"""The parts of deterministic mode: the setting and its reasons, MKL's strict mode (set in-process,
or by `rillet serve` before torch loads), the padded float32 matmul and the activations (row- and
position-independent), what is refused with a key-naming error, the self-test that refuses a
non-invariant model, the compiled step's policy, and the engine's stats saying whether it is on
(/metrics: rillet_deterministic)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from rillet.core import graph_setup
from rillet.core.attention.invariant import InvariantAttentionBackend
from rillet.core.attention.torch_backend import TorchAttentionBackend
from rillet.core.config import ConfigError, config_from_dict
from rillet.core.determinism import startup
from rillet.core.determinism.dense import RowPaddedWeight
from rillet.core.determinism.mkl import strict_in_force
from rillet.core.determinism.mode import resolve_deterministic
from rillet.core.determinism.model import check_supported, gelu_tanh, make_invariant, silu
from rillet.core.determinism.rows import RowPadding
from rillet.core.determinism.selftest import self_test
from rillet.core.llm import LLM
from rillet.core.model.arch import ModelArch
from rillet.core.model.decoder import build_model
from rillet.core.model.shapes import SHAPES
from rillet.http.cli import main as cli_main

pytestmark = pytest.mark.isa  # run again under an AVX2 cap (tests/test_isa_cap.py)

ROWS = RowPadding(strict_in_force())


def cfg(**sections: Any) -> Any:
    return config_from_dict(sections)


def test_the_setting_and_its_reasons() -> None:
    with pytest.raises(ConfigError, match=r"engine\.deterministic"):
        cfg(engine={"deterministic": "sometimes"})
    assert resolve_deterministic(cfg(engine={"deterministic": "off"}), "cpu") == (
        False,
        "engine.deterministic is off",
    )
    on, why = resolve_deterministic(cfg(), "cpu")  # the default, auto
    assert not on and "more than 5 %" in why
    assert resolve_deterministic(cfg(engine={"deterministic": "on"}), "cpu")[0]
    assert not resolve_deterministic(cfg(), "cuda")[0]
    with pytest.raises(ConfigError, match=r"engine\.deterministic.*CPU only"):
        resolve_deterministic(cfg(engine={"deterministic": "on"}), "cuda")
    with pytest.raises(ConfigError, match=r"engine\.deterministic.*tensor parallelism"):
        resolve_deterministic(
            cfg(engine={"deterministic": "on"}, parallel={"tensor_parallel_size": 2}), "cpu"
        )


def test_the_start_up_log_says_which_and_why(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="rillet.core.determinism"):
        startup.begin(cfg(), torch.device("cpu"))
        startup.begin(cfg(engine={"deterministic": "on"}), torch.device("cpu"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("deterministic inference: off (engine.deterministic auto -> off (it costs")
    assert "deterministic inference: on (engine.deterministic on)" in lines


def _in_fresh_python(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"} | env
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_mkl_strict_mode_is_set_before_mkl_runs_and_not_after() -> None:
    first = "from rillet.core.determinism.mkl import ensure_strict; print(ensure_strict())"
    assert _in_fresh_python(first) == "True"
    late = "import torch; torch.randn(8, 8) @ torch.randn(8, 8); " + first
    assert _in_fresh_python(late) == "False"
    by_env = "import torch; torch.randn(8, 8) @ torch.randn(8, 8); "
    by_env += "from rillet.core.determinism.mkl import strict_in_force; print(strict_in_force())"
    assert _in_fresh_python(by_env, MKL_CBWR="AUTO,STRICT") == "True"


def test_rillet_serve_asks_for_strict_mkl_before_torch_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MKL_CBWR", raising=False)
    assert cli_main(["config", "--set", "engine.deterministic=auto"]) == 0
    assert "MKL_CBWR" not in os.environ
    assert cli_main(["config", "--set", "engine.deterministic=on"]) == 0
    assert os.environ["MKL_CBWR"] == "AUTO,STRICT"


@pytest.mark.parametrize(("n", "k"), [(960, 576), (3072, 576), (128, 64), (49152, 64)])
def test_a_padded_float32_matmul_gives_a_row_the_same_bits_in_any_batch(n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(n)
    w = RowPaddedWeight(torch.randn(n, k, generator=gen), ROWS)
    x = torch.randn(70, k, generator=gen)
    full = w(x)
    assert torch.allclose(full, F.linear(x, w.weight), atol=1e-4)
    for m in (1, 2, 3, 5, 7, 9, 13, 17, 33):
        rows = torch.randperm(70, generator=gen)[:m]
        assert torch.equal(w(x[rows]), full[rows]), m


@pytest.mark.parametrize(
    ("fn", "ref"), [(silu, F.silu), (gelu_tanh, lambda x: F.gelu(x, approximate="tanh"))]
)
def test_the_activations_do_not_depend_on_an_elements_position(fn: Any, ref: Any) -> None:
    v = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 4
    whole = fn(v)
    assert torch.allclose(whole, ref(v), atol=1e-6)
    for start in (0, 1, 5, 17):
        for n in (31, 64, 100):
            assert torch.equal(fn(v[start : start + n]), whole[start : start + n])


def test_what_the_mode_cannot_run_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"engine\.deterministic.*mixture-of-experts"):
        check_supported(SHAPES["moe-8x1k"])


def _tiny_model(backend: Any) -> Any:
    arch = ModelArch(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
    )
    model = build_model(arch, backend, torch.float32, "cpu")
    model.init_random(0, std=0.1)
    return model


def test_the_self_test_passes_an_invariant_model_and_catches_one_that_is_not() -> None:
    model = _tiny_model(InvariantAttentionBackend(ROWS))
    make_invariant(model, ROWS)
    assert self_test(model, 16) is None
    plain = _tiny_model(TorchAttentionBackend())  # SDPA: a chunk's rows round differently
    failure = self_test(plain, 16)
    assert failure is not None and "differed" in failure


def test_a_failed_self_test_refuses_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(startup, "self_test", lambda model, bs: "a token's logits differed by up to 1e-07")
    with pytest.raises(ConfigError, match=r"engine\.deterministic.*self-test"):
        startup.finish(_tiny_model(InvariantAttentionBackend(ROWS)), ROWS, 16)


def test_the_compiled_step_is_not_served() -> None:
    model = SimpleNamespace(backend=InvariantAttentionBackend(ROWS))
    mode, why = graph_setup.decode_mode(cfg(engine={"deterministic": "on"}), model, torch.device("cpu"))  # type: ignore[arg-type]
    assert mode == "eager" and "engine.deterministic" in why
    with pytest.raises(ConfigError, match=r"graphs\.enabled"):
        graph_setup.decode_mode(
            cfg(engine={"deterministic": "on"}, graphs={"enabled": "on"}),
            model,  # type: ignore[arg-type]
            torch.device("cpu"),
        )


def test_the_engines_stats_say_whether_the_mode_is_on() -> None:
    tiny = {"kind": "shape", "shape": "tiny", "device": "cpu", "dtype": "float32", "quantization": "none"}
    for setting in ("on", "off"):
        with LLM(cfg(model=tiny, engine={"deterministic": setting}, graphs={"compile_mode": "none"})) as llm:
            assert llm.engine.stats().deterministic is (setting == "on")
