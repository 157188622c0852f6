"""`rillet` with faults injected, for tests only: the library itself carries no test hooks.

Run as a script in place of the `rillet` command (proc_helpers.RilletProcess does, given
`faults`). The patches are applied when this module is imported, at module level, so that the
processes multiprocessing's spawn starts (tensor-parallel ranks), which import the parent's main
module again as `__mp_main__`, get them too. Each is switched on by an environment variable:
  DIE_AFTER_STEPS  the engine thread raises once it has run this many steps
  LOAD_FAIL_RANK   this tensor-parallel rank raises while loading its shard
  LOAD_HOLD_S      building the engine first waits this many seconds (a slow model load)
"""

from __future__ import annotations

import os
import sys
from typing import Any

DIE_AFTER_STEPS = "RILLET_TEST_ENGINE_DIE_AFTER_STEPS"
LOAD_FAIL_RANK = "RILLET_TEST_TP_LOAD_FAIL_RANK"
LOAD_HOLD_S = "RILLET_TEST_LOAD_HOLD_S"


def _die_after(steps: int) -> None:
    from rillet.core.engine.core import EngineCore

    inner = EngineCore.step

    def step(self: EngineCore, *args: Any, **kwargs: Any) -> Any:
        if self.steps >= steps:
            raise RuntimeError(f"test-only engine death ({DIE_AFTER_STEPS}={steps})")
        return inner(self, *args, **kwargs)

    EngineCore.step = step  # type: ignore[method-assign]


def _fail_load(rank: int) -> None:
    from rillet.core.distributed import worker

    inner = worker._load

    def load(cfg: Any, this_rank: int, device: Any) -> Any:
        if this_rank == rank:
            raise RuntimeError(f"test-only load failure ({LOAD_FAIL_RANK}={rank})")
        return inner(cfg, this_rank, device)

    worker._load = load


def _hold_load(seconds: float) -> None:
    import time

    from rillet.core.engine.engine import Engine

    inner = Engine.__init__

    def init(self: Engine, *args: Any, **kwargs: Any) -> None:
        time.sleep(seconds)
        inner(self, *args, **kwargs)

    Engine.__init__ = init  # type: ignore[method-assign]


if os.environ.get(DIE_AFTER_STEPS):
    _die_after(int(os.environ[DIE_AFTER_STEPS]))
if os.environ.get(LOAD_FAIL_RANK):
    _fail_load(int(os.environ[LOAD_FAIL_RANK]))
if os.environ.get(LOAD_HOLD_S):
    _hold_load(float(os.environ[LOAD_HOLD_S]))

if __name__ == "__main__":
    from rillet.http.cli import main

    sys.exit(main())
