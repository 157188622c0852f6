"""The compiled steps of one model as saved artifacts: found on disk, or built and saved, then
loaded (graphs/aot/artifact_steps.py runs this on the decode step's compile thread; `rillet compile`
only builds).

A step is built in this process (export, then AOTInductor: graphs/aot/export.py) or, when the
plan has a `builder`, in another one: the server's builder is a niced child process that loads
the same model from the same config and saves the same keys (core/compile_process.py), so a cold
compile holds neither this process's GIL nor its cores' time slices.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from threading import Event
from typing import Any, Protocol

import torch
from rillet.graphs.aot.export import build_library, export_decode, export_verify
from rillet.graphs.aot.key import make_key
from rillet.graphs.aot.step import ByRows, SavedDecode, SavedVerify, agrees_with_eager, load_library
from rillet.graphs.aot.store import ArtifactStore
from rillet.graphs.compile_modes import autotunes_gemms
from rillet.graphs.interface import DecodeBatch, SavableModel, VerifyBatch

logger = logging.getLogger(__name__)

DECODE = "decode"
VERIFY = "verify"  # one step for every Q (graphs/aot/export.py)
# the decode step again with aten's GEMM kernels, for batches of few rows (graphs.small_batch):
# built only in autotuned modes, whose GEMM templates it leaves out, and traced within the model's
# small_step_gemms (torch's int4 kernel where the model keeps its layout beside rillet's)
DECODE_SMALL = "decode-small"
GEMM_BACKENDS = {DECODE_SMALL: "ATEN"}  # Inductor's max_autotune_gemm_backends of a step, if set
Progress = Callable[[str], None]


class Builder(Protocol):
    """Builds the named missing artifacts somewhere else (raises if it could not)."""

    def build(self, graphs: Sequence[str]) -> None: ...

    def cancel(self) -> None: ...


@dataclass(frozen=True)
class AotPlan:
    store: ArtifactStore
    builder: Builder | None = None  # None: build in this process


@dataclass(frozen=True)
class Obtained:
    decode: SavedDecode
    verify: SavedVerify | None
    seconds: dict[str, float]  # "build" (or "lookup" when nothing was missing), "load"


def _gemms_field(name: str) -> str:
    """The key's mark of a step built with its own GEMM backends (none for the others: their keys
    are those of before GEMM_BACKENDS)."""
    backends = GEMM_BACKENDS.get(name)
    return f"+{backends}" if backends else ""


class SavedSteps:
    """The decode step (and the verify step, when `verify`; the small-batch decode step, when
    `small_rows` and the mode autotunes GEMMs) of `model` as artifacts."""

    def __init__(
        self,
        model: SavableModel,
        plan: AotPlan,
        mode: str,
        freeze: bool,
        verify: bool = False,
        small_rows: int = 0,
    ) -> None:
        shape = model.graph_key()
        if shape is None:
            raise ValueError("this model's steps cannot be saved")
        self.model, self.plan, self.mode, self.freeze = model, plan, mode, freeze
        self.weights_key = model.weights_key()  # ~0.1 s per 100 MB of weights
        self.small_rows = small_rows if autotunes_gemms(mode) else 0
        names = [DECODE] + ([VERIFY] if verify else []) + ([DECODE_SMALL] if self.small_rows else [])
        mode_field = f"{mode}{'+frozen' if freeze else ''}"
        self.keys = {
            n: make_key(n, self.weights_key, shape.layout, shape.code, mode_field + _gemms_field(n))
            for n in names
        }
        plan.store.hold(self.keys.values())  # this process's steps: never evicted by its own saves

    def missing(self, names: Sequence[str] | None = None) -> list[str]:
        wanted = self.keys if names is None else names
        return [n for n in wanted if self.plan.store.find(self.keys[n]) is None]

    def build(
        self,
        names: Sequence[str],
        decode_example: DecodeBatch,
        verify_example: VerifyBatch | None,
        progress: Progress | None = None,
    ) -> None:
        """Exports, compiles and saves each named step here, one after the other."""
        say = progress or (lambda line: logger.info("%s", line))
        store = self.plan.store
        for i, name in enumerate(names, 1):
            say(f"compiling the {name} step ({i}/{len(names)}, AOTInductor, mode {self.mode})")
            start = time.perf_counter()
            if name in (DECODE, DECODE_SMALL):
                with self.model.small_step_gemms() if name == DECODE_SMALL else nullcontext():
                    program = export_decode(self.model, decode_example)
            else:
                assert verify_example is not None, "a verify step needs a verify example"
                program = export_verify(self.model, verify_example)
            tmp = store.build_dir()  # a killed build's is deleted by the next one (store.sweep)
            try:
                frozen = self.weights_key if self.freeze else None
                library = build_library(program, self.mode, frozen, tmp, GEMM_BACKENDS.get(name))
                seconds = time.perf_counter() - start
                path = store.save(self.keys[name], library, seconds)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            say(f"built the {name} step in {seconds:.1f} s: {path}")

    def obtain(
        self, decode_example: DecodeBatch, verify_example: VerifyBatch | None, stopping: Event
    ) -> Obtained | None:
        """The decode and verify steps loaded: those missing built first (by the plan's builder,
        else here). None when `stopping` was set meanwhile (the engine is closing: nothing is
        loaded). The small-batch step comes after, from `with_small`."""
        seconds: dict[str, float] = {}
        start = time.perf_counter()
        missing = self._build_missing(
            [n for n in self.keys if n != DECODE_SMALL], decode_example, verify_example
        )
        if stopping.is_set():
            return None
        seconds["build" if missing else "lookup"] = time.perf_counter() - start
        start = time.perf_counter()
        decode = self.load_decode(decode_example)
        verify = None
        if verify_example is not None:
            verify = self.load_verify(VERIFY, verify_example)
        seconds["load"] = time.perf_counter() - start
        return Obtained(decode, verify, seconds)

    def with_small(self, general: SavedDecode, example: DecodeBatch, stopping: Event) -> ByRows | None:
        """`general` beside the small-batch step (built first if missing), or None: no small-batch
        step for this mode or config, or the engine is closing."""
        if not self.small_rows:
            return None
        self._build_missing([DECODE_SMALL], example, None)
        if stopping.is_set():
            return None
        return ByRows(self.load_decode(example, DECODE_SMALL), general, self.small_rows)

    def _build_missing(
        self, names: Sequence[str], decode_example: DecodeBatch, verify_example: VerifyBatch | None
    ) -> list[str]:
        missing = self.missing(names)
        builder = self.plan.builder
        if missing and builder is not None:
            logger.info("building compiled steps %s in a background process (niced)", ", ".join(missing))
            builder.build(missing)
        elif missing:
            self.build(missing, decode_example, verify_example)
        return missing

    def load_decode(self, example: DecodeBatch, name: str = DECODE) -> SavedDecode:
        runner = self._load(name)
        step = SavedDecode(runner, self.model.step_state())
        self._check(name, step(example), self.model.forward_decode_with(example, step.state))
        return step

    def load_verify(self, name: str, example: VerifyBatch) -> SavedVerify:
        step = SavedVerify(self._load(name), self.model.step_state())
        self._check(name, step(example), self.model.forward_verify_with(example, step.state))
        return step

    def _load(self, name: str) -> Callable[..., Any]:
        key = self.keys[name]
        path = self.plan.store.find(key)
        if path is None:
            raise RuntimeError(f"no {name} artifact after its build ({self.plan.store.folder(key)})")
        try:
            runner, seconds = load_library(path)
        except Exception as exc:  # an unloadable library: rebuilt by the next start
            self.plan.store.discard(key, f"it did not load: {type(exc).__name__}: {exc}")
            raise
        logger.info("%s step: loaded the compiled artifact %s in %.1f s (no compile)", name, path, seconds)
        return runner

    def _check(self, name: str, saved: torch.Tensor, eager: torch.Tensor) -> None:
        problem = agrees_with_eager(saved, eager)
        if problem is not None:
            self.plan.store.discard(self.keys[name], f"it disagrees with the eager step: {problem}")
            raise RuntimeError(f"the saved {name} step disagrees with eager ({problem})")
