"""graphs.small_batch: decode batches of few rows through a second saved step built with aten's
GEMM kernels (graphs/aot/saved.py DECODE_SMALL), larger ones through the autotuned step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from rillet.core import compile_process
from rillet.core.config import ConfigError, config_from_dict
from rillet.core.llm import LLM
from rillet.core.runner.model_runner import ModelRunner
from rillet.core.sampling_params import SamplingParams
from rillet.graphs.aot.saved import DECODE, DECODE_SMALL, VERIFY, AotPlan, SavedSteps
from rillet.graphs.aot.step import AUTO_SMALL_BATCH, ByRows, small_batch_rows
from rillet.graphs.aot.store import ArtifactStore
from rillet.graphs.interface import DecodeBatch, GraphKey

pytestmark = [pytest.mark.compiled, pytest.mark.artifacts]  # the saved-steps path (tests/conftest.py)

PROMPTS = [[(5 * i + 2 * k) % 200 + 1 for k in range(4 + i)] * 2 for i in range(4)]


class _Model:
    def graph_key(self) -> GraphKey:
        return GraphKey("layout", "code")

    def weights_key(self) -> str:
        return "weights"


def _steps(tmp_path: Path, mode: str, small: int) -> SavedSteps:
    plan = AotPlan(ArtifactStore(tmp_path))
    return SavedSteps(_Model(), plan, mode, freeze=True, verify=True, small_rows=small)  # type: ignore[arg-type]


def test_the_small_batch_step_is_saved_only_in_autotuned_modes(tmp_path: Path) -> None:
    steps = _steps(tmp_path, "max-autotune-no-cudagraphs", 4)
    assert list(steps.keys) == [DECODE, VERIFY, DECODE_SMALL] and steps.small_rows == 4
    assert steps.keys[DECODE_SMALL] != steps.keys[DECODE]  # its own artifact, never the decode one's
    assert steps.missing([DECODE]) == [DECODE]
    # without GEMM templates every GEMM is aten's already: nothing to add
    assert list(_steps(tmp_path, "default", 4).keys) == [DECODE, VERIFY]
    assert list(_steps(tmp_path, "max-autotune-no-cudagraphs", 0).keys) == [DECODE, VERIFY]
    # the decode step's key does not move with the option: artifacts saved before stay valid
    assert _steps(tmp_path, "max-autotune-no-cudagraphs", 0).keys[DECODE] == steps.keys[DECODE]


class _Step:
    def __init__(self) -> None:
        self.rows: list[int] = []

    def __call__(self, batch: DecodeBatch) -> torch.Tensor:
        self.rows.append(batch.num_rows)
        return torch.zeros(batch.num_rows, 1)


def test_by_rows_sends_few_rows_to_the_small_step() -> None:
    small, general = _Step(), _Step()
    both = ByRows(small, general, 2)  # type: ignore[arg-type]
    for n in (1, 2, 3, 8, 2):
        both(_batch(n))
    assert small.rows == [1, 2, 2] and general.rows == [3, 8]


def _batch(n: int) -> Any:
    class _B:
        num_rows = n

    return _B()


def test_a_bad_small_batch_names_the_key() -> None:
    for bad in (-1, 17):
        with pytest.raises(ConfigError) as err:
            config_from_dict({"graphs": {"small_batch": bad}})
        assert err.value.key == "graphs.small_batch"
    assert config_from_dict({}).graphs.small_batch == "auto"
    assert config_from_dict({"graphs": {"small_batch": 3}}).graphs.small_batch == 3


def test_auto_takes_the_small_batch_step_where_the_cpu_has_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    for amx, rows in ((True, AUTO_SMALL_BATCH), (False, 0)):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx)
        assert small_batch_rows("auto") == rows
        assert small_batch_rows(2) == 2  # a number is kept on any CPU


def test_auto_with_rillets_int4_kernel_is_one_row_with_an_aten_copy_else_none() -> None:
    """rillet's kernel is a custom op every step calls alike: without AMX no second step (it would
    only keep Inductor's int4 template off few rows); with AMX, single rows through torch's kernel
    on the codes' aten copy, measured faster there at one row (core/quant/int4.py)."""
    from types import SimpleNamespace

    from rillet.core.graph_setup import AMX_SMALL_BATCH, small_batch

    cases = [
        (True, False, "auto", 0),
        (True, True, "auto", AMX_SMALL_BATCH),
        (False, False, "auto", "auto"),  # torch's kernels: graphs/ decides by the CPU
        (True, True, 3, 3),
    ]
    for rows_kernel, copy, setting, want in cases:
        cfg = config_from_dict({"graphs": {"small_batch": setting}})
        model = SimpleNamespace(int4_rows_kernel=rows_kernel, int4_aten_copy=copy)
        assert small_batch(cfg, model) == want  # type: ignore[arg-type]


def test_saved_small_batch_step_gives_the_eager_tokens(
    tiny_hf_model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The compile children at this process's priority, not the server's nice 19: this process only
    # waits for them, and at 19 they got what the other xdist worker left of the two cores (the
    # module took 4-5x its quiet time on a busy box against ~2x for the other compiled modules).
    # Their niceness is tests/core/test_compile_child.py's to check.
    monkeypatch.setattr(compile_process, "CHILD_NICE", 0)
    folder, _ = tiny_hf_model("llama")
    cfg = config_from_dict(
        {
            "model": {"path": str(folder), "kind": "hf", "dtype": "float32", "cache_dir": str(tmp_path)},
            "graphs": {
                "enabled": "on",
                "buckets": [1, 2, 4],
                "compile_mode": "max-autotune-no-cudagraphs",
                "small_batch": 2,
                "short_prefill": 0,
            },
        }
    )
    with LLM(cfg) as llm:
        runner = llm.engine.core.runner
        assert isinstance(runner, ModelRunner) and runner.graph_runner is not None
        compiled = runner.graph_runner.compiled
        assert compiled is not None and compiled.wait(timeout=600) and compiled.failed is None
        both = compiled.fn
        assert isinstance(both, ByRows) and both.rows == 2
        calls = {"small": 0, "general": 0}

        def counted(step: Any, name: str) -> Any:
            def run(batch: DecodeBatch) -> torch.Tensor:
                calls[name] += 1
                return step(batch)

            return run

        both.small, both.general = counted(both.small, "small"), counted(both.general, "general")

        def generate(n: int, graph: bool) -> list[list[int]]:
            compiled.ready = graph  # off: decode steps run eager
            try:
                params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
                return [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:n], params)]
            finally:
                compiled.ready = True

        assert generate(1, True) == generate(1, False)
        assert calls["small"] > 0 and calls["general"] == 0
        assert generate(4, True) == generate(4, False)
        assert calls["general"] > 0  # 4 rows: the general step (and small once 2 or fewer remain)
