"""Shared hooks and fixtures: pytest-xdist's threads and module order, the switches that keep
compiles, saved steps and short-prefill steps to the tests marked for them, and session fixtures
over the builders of tests/support/tiny_models/: `tiny_hf_model` saves small random transformers
models to disk once per session; `lora_setup` LoRA adapters peft made for one of them; `st_folder`
does the same for sentence-transformers folders (embeddings)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from rillet.graphs.runner import GraphRunner
from tiny_models.gemma3_vlm import build_gemma3_vlm
from tiny_models.hf_folders import TinyHFModel, make_tiny_hf_model
from tiny_models.lora_adapters import build_lora_setup
from tiny_models.st_folders import make_st_folder

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a model folder's path is never looked up on a hub


def _inductor_cache_per_isa_cap() -> None:
    """Inductor's cache key leaves ATEN_CPU_CAPABILITY out (graphs/compile_modes.py
    set_compile_cache_dir): a run under the AVX2 cap (tests/test_isa_cap.py, or a developer's)
    and one without it would load each other's kernels, built for the other vector width, and
    abort ("double free or corruption") or compute garbage. One folder per cap under the one torch
    would use (TORCHINDUCTOR_CACHE_DIR, set on some machines, or torch's default), as the server
    keeps under model.cache_dir; xdist's workers inherit the controller's choice."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    folder = f"isa-{os.environ.get('ATEN_CPU_CAPABILITY') or 'native'}"
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    if os.path.basename(os.path.normpath(base)) != folder:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, folder)


_inductor_cache_per_isa_cap()


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs two workers) each worker gets one core: one torch thread
    per worker and per process it starts. Two workers of two threads each would oversubscribe the
    two cores, and OpenMP's spin-waiting turns that into a slowdown of several times."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
        # Inductor compiles its C++ on a thread per core, decided at its first compile (here, and
        # in the compile children and subprocesses, which inherit this): the other worker holds
        # the second core, and the threads cost CPU time of their own (cold, alone on 2 cores:
        # test_small_batch_step 60 -> 53 s user, test_compiled_verify[auto] 30 -> 26 s, neither
        # slower in wall time)
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    # xdist's loadfile queue is sorted by test count by default, which sends the modules of one or
    # two long tests (a compile, the numerics subprocesses) last: one worker then runs them alone
    # while the other idles. Queued in collection order instead, heavy modules first (below).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


HEAVY_MARKS = ("compiled", "slow")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a test marked `compiled` or `slow` first (stable: otherwise in collection
    order), so that under `--dist loadfile` the many short modules fill in at the end, whichever
    worker finishes its long ones first."""
    heavy = {_module_of(item) for item in items if any(item.get_closest_marker(m) for m in HEAVY_MARKS)}
    items.sort(key=lambda item: _module_of(item) not in heavy)


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.fixture(scope="session")
def tiny_hf_model(tmp_path_factory: pytest.TempPathFactory) -> TinyHFModel:
    """Factory: `tiny_hf_model("llama", tie_word_embeddings=True)` -> (folder, fp32 HF model in eval);
    identical arguments reuse the saved folder (tiny_models/hf_folders.py)."""
    return make_tiny_hf_model(tmp_path_factory)


@pytest.fixture(scope="session", autouse=True)
def _compile_switch() -> Iterator[dict[str, bool]]:
    """`graphs.enabled: auto` compiles the decode step on CPU, on a background thread, for every
    engine. Only tests marked `compiled` (a module's pytestmark, or a test's own mark) build it;
    the others run eager: dozens of compiles would cost minutes of the suite's budget, and a
    compile left running competes for the 2 cores with the tests after it. Patched for the whole
    session, so that module- and session-scoped fixtures (set up before any function-scoped
    fixture) are covered too."""
    switch = {"on": False}
    real = GraphRunner.start_compile

    def start_compile(self: GraphRunner, background: bool = True) -> None:
        if switch["on"]:
            real(self, background)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GraphRunner, "start_compile", start_compile)
        yield switch


@pytest.fixture(scope="session", autouse=True)
def _artifacts_switch() -> Iterator[dict[str, bool]]:
    """`graphs.artifacts: on` (the default) saves the compiled CPU step under model.cache_dir and
    builds a missing one in a child process. Only tests marked `artifacts` take that path; the other
    compiled tests keep testing torch.compile, and none writes into the user's cache folder."""
    from rillet.core import graph_setup

    switch = {"on": False}
    real = graph_setup.artifact_plan

    def artifact_plan(cfg: Any, model: Any, in_process: bool = False) -> Any:
        return real(cfg, model, in_process) if switch["on"] else None

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graph_setup, "artifact_plan", artifact_plan)
        yield switch


@pytest.fixture(scope="session", autouse=True)
def _short_prefill_switch() -> Iterator[dict[str, bool]]:
    """`graphs.short_prefill` (on by default) builds the compiled multi-query step beside the decode
    step even with speculation off: two more compiles per compiled engine. Only tests marked
    `short_prefill` get it built for that alone; an engine that speculates builds it anyway (and
    its short prefill steps run through it)."""
    from rillet.core import graph_setup

    switch = {"on": False}
    real = graph_setup.verify_queries

    def verify_queries(cfg: Any, model: Any, mode: str) -> int:
        return real(cfg, model, mode) if switch["on"] or cfg.speculative.enabled else 0

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graph_setup, "verify_queries", verify_queries)
        yield switch


@pytest.fixture(scope="module", autouse=True)
def _short_prefill_in_marked_modules(
    request: pytest.FixtureRequest, _short_prefill_switch: dict[str, bool]
) -> Iterator[None]:
    _short_prefill_switch["on"] = request.node.get_closest_marker("short_prefill") is not None
    yield
    _short_prefill_switch["on"] = False


@pytest.fixture(scope="module", autouse=True)
def _artifacts_in_marked_modules(
    request: pytest.FixtureRequest, _artifacts_switch: dict[str, bool]
) -> Iterator[None]:
    _artifacts_switch["on"] = request.node.get_closest_marker("artifacts") is not None
    yield
    _artifacts_switch["on"] = False


@pytest.fixture(scope="module", autouse=True)
def _compile_in_marked_modules(
    request: pytest.FixtureRequest, _compile_switch: dict[str, bool]
) -> Iterator[None]:
    _compile_switch["on"] = request.node.get_closest_marker("compiled") is not None
    yield
    _compile_switch["on"] = False


@pytest.fixture(autouse=True)
def _compile_in_marked_tests(
    request: pytest.FixtureRequest, _compile_switch: dict[str, bool]
) -> Iterator[None]:
    before = _compile_switch["on"]
    _compile_switch["on"] = request.node.get_closest_marker("compiled") is not None
    yield
    _compile_switch["on"] = before


# ---- LoRA adapters --------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def lora_setup(tiny_hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """{"folder": base model, "paths": name -> adapter folder, "refs": name (None: base) -> tokens
    per prompt of PROMPTS}, the references generated one prompt at a time (no padding)
    (tiny_models/lora_adapters.py)."""
    return build_lora_setup(tiny_hf_model, tmp_path_factory)


@pytest.fixture(scope="session")
def st_folder(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: `st_folder("bert" | "decoder", pooling=..., normalize=...)` -> a tiny random
    sentence-transformers folder; identical arguments reuse it (tiny_models/st_folders.py)."""
    return make_st_folder(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_gemma3_vlm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(folder, fp32 HF Gemma3ForConditionalGeneration): a tiny random Gemma 3 vision-language model
    with its tokenizer and processor, saved by transformers (tiny_models/gemma3_vlm.py)."""
    folder = tmp_path_factory.mktemp("hf_gemma3_vlm")
    return folder, build_gemma3_vlm(folder)
