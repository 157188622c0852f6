"""Saved compiled steps (graphs/aot/, `graphs.artifacts`): `rillet compile` in one process, the
server's engine in the next, on a tiny model.

One build for the module (a `rillet compile` subprocess: the decode step and the speculative
verify step). The engine then loads both and compiles nothing, over a KV pool of another size than
the build's; its tokens equal the eager step's. An artifact that is truncated, has bytes flipped,
or whose manifest says another torch or ISA cap is refused with a warning, deleted and built
again (here by a stand-in builder that puts the good copy back, so no second compile runs).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from proc_helpers import RilletProcess
from rillet.core.compile_ahead import compile_artifacts
from rillet.core.config import RilletConfig, config_from_dict
from rillet.core.llm import LLM
from rillet.core.loaders.weights_cache import default_cache_dir
from rillet.core.runner.model_runner import ModelRunner
from rillet.core.sampling_params import SamplingParams
from rillet.graphs.aot.key import ArtifactKey, make_key
from rillet.graphs.aot.saved import AotPlan
from rillet.graphs.aot.store import LIBRARY, MANIFEST, ArtifactStore
from rillet.graphs.compiled import CompiledDecode
from rillet.graphs.runner import GraphRunner
from torch._dynamo.utils import counters

pytestmark = [pytest.mark.compiled, pytest.mark.artifacts]

PROMPTS = [[(7 * i + 3 * k) % 250 + 1 for k in range(3 + 2 * i)] * 3 for i in range(4)]
SERVE_BLOCKS = 37  # the server's pool; `rillet compile` builds over a pool of 4 blocks


@dataclass
class Built:
    cache: Path
    output: str  # what `rillet compile` printed
    settings: dict[str, Any]


def _settings(folder: Path, cache: Path) -> dict[str, Any]:
    return {
        "model": {
            "path": str(folder),
            "kind": "hf",
            "dtype": "float32",
            "device": "cpu",
            "cache_dir": str(cache),
            "num_threads": torch.get_num_threads(),  # the key holds it: the build and the engine agree
        },
        "graphs": {"enabled": "on", "buckets": [1, 2, 4]},
        "speculative": {"method": "ngram", "num_tokens": 3, "max_batch": 4},
    }


def _overrides(settings: dict[str, Any]) -> list[str]:
    return [f"--set={s}.{k}={v}" for s, keys in settings.items() for k, v in keys.items()]


@pytest.fixture(scope="module")
def built(tiny_hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Built:
    folder, _ = tiny_hf_model("llama")
    cache = tmp_path_factory.mktemp("rillet_cache")
    settings = _settings(folder, cache)
    cmd = [sys.executable, "-m", "rillet.http.cli", "compile", *_overrides(settings)]
    env = {**os.environ, **_inductor_env()}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return Built(cache, done.stdout, _settings(folder, cache))


def _inductor_env() -> dict[str, str]:
    """Inductor's own caches (its precompiled headers) where the other compiled tests keep theirs."""
    isa = os.environ.get("ATEN_CPU_CAPABILITY") or "native"
    return {"TORCHINDUCTOR_CACHE_DIR": str(default_cache_dir() / "torch-compile" / f"isa-{isa}")}


def _config(built: Built, **changes: Any) -> RilletConfig:
    return config_from_dict(built.settings, [f"{k}={v}" for k, v in changes.items()])


@pytest.fixture(scope="module")
def served(built: Built) -> Iterator[tuple[LLM, GraphRunner, list[str]]]:
    """The engine started on the saved steps, and what it logged while it got them."""
    llm, gr, lines = _start(_config(built, **{"cache.num_blocks": SERVE_BLOCKS}))
    try:
        yield llm, gr, lines
    finally:
        llm.close()


def _start(cfg: RilletConfig) -> tuple[LLM, GraphRunner, list[str]]:
    """An engine started on `cfg` once its compiled step is in use, and what it logged meanwhile;
    no graph compiled in this process."""
    lines: list[str] = []
    handler = _Lines(lines)
    rillet_log = logging.getLogger("rillet")
    level = rillet_log.level
    rillet_log.setLevel(logging.INFO)
    rillet_log.addHandler(handler)
    graphs = int(counters["stats"]["unique_graphs"])
    llm = LLM(cfg)
    try:
        runner = llm.engine.core.runner
        assert isinstance(runner, ModelRunner) and runner.graph_runner is not None
        gr = runner.graph_runner
        assert gr.compiled is not None and gr.compiled.wait(timeout=300), "no compiled step"
        assert gr.compiled.failed is None, gr.compiled.failed
        assert int(counters["stats"]["unique_graphs"]) == graphs, "dynamo compiled a graph"
    except BaseException:
        llm.close()
        raise
    finally:
        rillet_log.removeHandler(handler)
        rillet_log.setLevel(level)
    return llm, gr, lines


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_rillet_compile_prints_a_line_per_step(built: Built) -> None:
    out = built.output
    assert "compiling the decode step (1/2" in out and "compiling the verify step (2/2" in out
    assert out.count("built the ") == 2


def test_serve_after_compile_loads_both_steps_and_compiles_nothing(
    served: tuple[LLM, GraphRunner, list[str]],
) -> None:
    llm, gr, lines = served
    text = "\n".join(lines)
    assert "decode step: loaded the compiled artifact" in text
    assert "verify step: loaded the compiled artifact" in text
    assert "building compiled steps" not in text and "torch.compile" not in text.split("saved under")[-1]
    assert llm.engine.core.blocks.num_blocks == SERVE_BLOCKS  # not the build's pool of 4 blocks
    assert gr.compiled is not None and gr.compiled.ready and gr.compiled.ready_1
    assert gr.verify_compiled is not None and gr.verify_compiled.ready and gr.verify_compiled.ready_1


def test_rillet_serve_after_rillet_compile_compiles_nothing(built: Built) -> None:
    """The command pair a container image uses: `rillet serve` starts on the saved steps (the
    pool here is sized from memory, not the build's 4 blocks) and starts no compile."""
    sets = [s.removeprefix("--set=") for s in _overrides(built.settings)]
    server = RilletProcess("serve", *sets, "cache.memory_gb=0.01", env=_inductor_env())
    try:
        server.wait_for_line("compiled graph in use (saved artifact)", 300)
    finally:
        server.kill()
    assert "decode step: loaded the compiled artifact" in server.log
    assert "verify step: loaded the compiled artifact" in server.log
    assert "building compiled steps" not in server.log and "compile process" not in server.log


def test_saved_steps_give_the_eager_tokens(served: tuple[LLM, GraphRunner, list[str]]) -> None:
    llm, gr, _ = served
    assert gr.compiled is not None

    def generate(n: int, compiled: bool) -> list[list[int]]:
        assert gr.compiled is not None
        gr.compiled.ready = compiled  # off: decode and verify steps run eager
        try:
            params = [SamplingParams(max_tokens=12 + i, temperature=0.0, ignore_eos=True) for i in range(n)]
            return [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:n], params)]
        finally:
            gr.compiled.ready = True

    for n in (1, 3):
        replays, verifies = gr.num_replays, gr.num_verify_runs
        assert generate(n, compiled=True) == generate(n, compiled=False), n
        assert gr.num_replays > replays and gr.num_verify_runs > verifies, n


def test_a_config_switch_and_back_loads_the_saved_steps(built: Built, tmp_path: Path) -> None:
    """Default, then another config (`cache.dtype=int8`: another KV layout), then the default
    again: the third start loads its saved steps. The variant's steps are put in place as its
    compile child would (ArtifactStore.save), from copies of the built libraries: no compile."""
    store = ArtifactStore(tmp_path / "compiled")
    shutil.copytree(built.cache / "compiled", store.root)
    manifests = [json.loads((f / MANIFEST).read_text()) for f in store.root.glob("*-*")]
    built_keys = [ArtifactKey(**m["key"]) for m in manifests]
    for key in built_keys:
        shutil.copy(store.folder(key) / LIBRARY, tmp_path / "variant.so")
        store.save(dataclasses.replace(key, layout="kv-int8"), tmp_path / "variant.so", 1.0)
    assert all(store.folder(key).exists() for key in built_keys)
    llm, _, lines = _start(_config(built, **{"model.cache_dir": tmp_path}))
    llm.close()
    text = "\n".join(lines)
    assert "decode step: loaded the compiled artifact" in text and "verify step: loaded" in text
    assert "building compiled steps" not in text


def test_compiling_again_builds_nothing(built: Built) -> None:
    said: list[str] = []
    assert compile_artifacts(_config(built), said.append) == []
    assert said[-1] == "every compiled step is saved already"


def _truncate(folder: Path) -> None:
    package = folder / LIBRARY
    package.write_bytes(package.read_bytes()[: package.stat().st_size // 2])


def _flip(folder: Path) -> None:
    package = folder / LIBRARY
    data = bytearray(package.read_bytes())
    for i in range(1000, len(data), len(data) // 7):
        data[i] ^= 0xFF
    package.write_bytes(bytes(data))


def _manifest_says(field: str, value: str) -> Any:
    def forge(folder: Path) -> None:
        manifest = json.loads((folder / MANIFEST).read_text())
        manifest["key"][field] = value
        (folder / MANIFEST).write_text(json.dumps(manifest))

    return forge


class _PutBack:
    """A stand-in for the compile process: 'builds' by copying the good artifact into place."""

    def __init__(self, good: Path, store: ArtifactStore) -> None:
        self.good, self.store = good, store
        self.built: list[str] = []

    def build(self, graphs: Sequence[str]) -> None:
        self.built.extend(graphs)
        for name in graphs:
            src = next(self.good.glob(f"{name}-*"))
            shutil.copytree(src, self.store.root / src.name)

    def cancel(self) -> None:
        pass


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_truncate, "truncated"),
        (_flip, "corrupted"),
        (_manifest_says("isa", "AVX2/env=avx2/cpu=0"), "another isa"),
        (_manifest_says("torch", "2.12.0+0"), "another torch"),
    ],
    ids=["truncated", "flipped", "isa", "torch"],
)
def test_a_damaged_artifact_is_refused_and_rebuilt(
    damage: Any,
    reason: str,
    served: tuple[LLM, GraphRunner, list[str]],
    built: Built,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, gr, _ = served
    good = built.cache / "compiled"
    store = ArtifactStore(tmp_path / "compiled")
    shutil.copytree(good, store.root)
    damaged = next(store.root.glob("decode-*"))
    damage(damaged)
    builder = _PutBack(good, store)
    cd = CompiledDecode(
        gr.model,
        gr.compile_mode,
        max_blocks_per_seq=8,
        device=torch.device("cpu"),
        check_faster=False,
        with_batch_1=True,
        plan=AotPlan(store, builder),
    )
    with caplog.at_level(logging.WARNING, logger="rillet.graphs.aot.store"):
        cd.start(background=False)
    assert builder.built == ["decode"]
    assert any(reason in r.getMessage() and "refused" in r.getMessage() for r in caplog.records), caplog.text
    assert cd.ready and cd.failed is None
    assert store.find(make_key("decode", *_key_fields(damaged))) is not None  # the rebuilt one


def _key_fields(folder: Path) -> tuple[str, str, str, str]:
    key = json.loads((folder / MANIFEST).read_text())["key"]
    return key["model"], key["layout"], key["code"], key["mode"]


def test_the_key_changes_with_the_isa_cap_and_the_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)  # a capped run: the key without the variable
    base = make_key("decode", "w", "l", "c", "m")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert make_key("decode", "w", "l", "c", "m").digest() != base.digest()
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert make_key("decode", "w", "l", "c", "m").differs(base.fields()) == ["threads"]
    finally:
        torch.set_num_threads(threads)
