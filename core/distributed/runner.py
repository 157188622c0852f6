"""Rank 0's runner under tensor parallelism: any failed step is fatal, and names the rank at fault.

After an exception inside a step the ranks are out of step with each other (one may be waiting in
a collective the others never reach), so no further step can run: the engine must stop, and the
server answer 503 and exit, rather than fail one batch and carry on as with one rank. Both halves
of a step can fail: the launch (broadcast, forward, all-reduces) and, on a device, the wait.
"""

from __future__ import annotations

from collections.abc import Callable

from rillet.core.engine.scheduler import ScheduledBatch
from rillet.core.runner.base import FatalRunnerError, InflightStep, SampleResult
from rillet.core.runner.model_runner import ModelRunner
from rillet.core.sequence import Seq

_DETAIL_CHARS = 160  # of the collective's own error (gloo's run to several sentences)


class TPRunner:
    def __init__(self, inner: ModelRunner, diagnose: Callable[[], str | None]) -> None:
        self.inner = inner
        self.diagnose = diagnose

    def launch(self, batch: ScheduledBatch) -> InflightStep:
        try:
            return _Guarded(self.inner.launch(batch), self)
        except Exception as exc:
            raise self.fatal(exc) from exc

    def release(self, seq: Seq) -> None:
        self.inner.release(seq)

    def poll(self) -> None:
        self.inner.poll()

    def close(self) -> None:
        self.inner.close()

    def fatal(self, exc: Exception) -> FatalRunnerError:
        cause = self.diagnose()
        first = str(exc).splitlines()[0] if str(exc) else ""
        detail = f"{type(exc).__name__}: {first[:_DETAIL_CHARS]}"
        reason = f"{cause} ({detail})" if cause else detail
        return FatalRunnerError(f"tensor-parallel step failed: {reason}")


class _Guarded:
    def __init__(self, inner: InflightStep, runner: TPRunner) -> None:
        self.inner, self.runner = inner, runner
        self.seqs = inner.seqs

    def ready(self) -> bool:
        return self.inner.ready()

    def wait(self) -> SampleResult:
        try:
            return self.inner.wait()
        except Exception as exc:
            raise self.runner.fatal(exc) from exc
