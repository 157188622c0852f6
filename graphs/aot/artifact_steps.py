"""The compiled CPU decode step from saved artifacts (ArtifactSteps, a part of CompiledDecode:
graphs/compiled.py): found, or built and saved, then loaded, instead of torch.compile.

With an artifact plan (`plan`: graphs/aot/), the step is first looked up as a saved AOTInductor
library under the model's key, and built and saved when there is none (in a niced child process
when the plan has a builder): a restart then loads it in a second or two and compiles nothing.
Its row dimension starts at 1 (export keeps that symbol), so the one library serves batch 1 as
well, and the KV pool's block count is an input dimension: another pool size reuses it. When no
plan is given, or the model cannot be saved, or the artifact path fails, the step is compiled
with torch.compile (graphs/compiled.py).

Apart from the torch.compile path: what it publishes (a loaded library, the small-batch step
beside it) and how it fails back are its own, and `rillet compile` uses it alone (build only).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import cast

import torch
from rillet.graphs.aot.saved import AotPlan, Progress, SavedSteps
from rillet.graphs.aot.step import SavedDecode
from rillet.graphs.compile_modes import COMPILE_ROWS, COMPILE_WIDTH, DecodeFn
from rillet.graphs.compile_thread import summary
from rillet.graphs.interface import DecodeBatch, DecodeModel, SavableModel
from rillet.graphs.static_buffers import StaticBuffers
from rillet.graphs.verify import CompiledVerify

logger = logging.getLogger(__name__)


class ArtifactSteps:
    """CompiledDecode's steps from saved artifacts; see the module docstring."""

    # CompiledDecode's state that this part reads and writes (set in its __init__)
    model: DecodeModel
    plan: AotPlan | None
    small_batch: int
    verify: CompiledVerify | None
    compile_mode: str
    freeze: bool
    check_faster: bool
    with_batch_1: bool
    fn: DecodeFn
    ready: bool
    ready_1: bool
    seconds: dict[str, float]
    _warm: StaticBuffers
    _stopping: threading.Event

    def _from_artifacts(self, plan: AotPlan) -> bool:
        """The steps from saved artifacts (built first if missing); False: compile them instead."""
        verify = self.verify
        try:
            steps = self._saved_steps(plan)
            if steps is None:
                logger.info("decode step: this model's compiled step cannot be saved (torch.compile)")
                return False
            got = steps.obtain(self._example(), verify.example() if verify else None, self._stopping)
        except Exception as exc:  # a failed build or load: torch.compile, as without artifacts
            logger.warning("compiled artifacts unusable (%s): compiling with torch.compile", summary(exc))
            return False
        if got is None:
            return True  # the engine is closing: nothing is published
        self.fn, self.seconds = got.decode, got.seconds
        if verify is not None and got.verify is not None:
            verify.use(got.verify)
        if not self.check_faster:
            self.ready_1 = self.with_batch_1  # one library serves every row count
            self.ready = True
            logger.info("decode step: compiled graph in use (saved artifact)")
        self._add_small(steps, got.decode)
        return True

    def _add_small(self, steps: SavedSteps, general: SavedDecode) -> None:
        """The small-batch step beside the general one once it is built (a first start builds it
        last, while the general step already serves); a failure leaves the general step alone."""
        try:
            both = steps.with_small(general, self._example(), self._stopping)
        except Exception as exc:
            logger.warning(
                "small-batch decode step off (%s): every batch takes the general step", summary(exc)
            )
            return
        if both is not None:
            self.fn = both  # one attribute write: the engine thread's next step takes it
            logger.info("decode step: batches of up to %d rows take the small-batch step", both.rows)

    def build_artifacts(
        self, progress: Progress | None = None, names: Sequence[str] | None = None
    ) -> list[str]:
        """The missing saved steps (of `names`, else all), built in this process (see
        GraphRunner.build_artifacts)."""
        steps = self._saved_steps(self.plan) if self.plan is not None else None
        if steps is None:
            raise RuntimeError("nothing is saved for this step (no plan, or a model that cannot be)")
        missing = steps.missing([n for n in steps.keys if names is None or n in names])
        with torch.inference_mode():
            example = self.verify.example() if self.verify is not None else None
            steps.build(missing, self._example(), example, progress)
        return missing

    def _saved_steps(self, plan: AotPlan) -> SavedSteps | None:
        model = cast(SavableModel, self.model)
        if model.graph_key() is None:
            return None
        return SavedSteps(
            model,
            plan,
            self.compile_mode,
            self.freeze,
            verify=self.verify is not None,
            small_rows=self.small_batch,
        )

    def _example(self) -> DecodeBatch:
        return self._warm.padding(COMPILE_ROWS, COMPILE_WIDTH)
