"""Does a CPU model gain from overlapped steps with a worker thread? (engine.overlap `auto` on CPU)

On CPU, torch runs a step's ops on the thread that calls them, so `engine.overlap: on` alone
changes nothing but the order of the host's work. The only way a CPU step can overlap the host's
post-processing is a worker thread that runs the forward and sampling while the engine thread
schedules, detokenizes and publishes. This script measures that: the default model offline (greedy,
EOS ignored), engine.overlap off against on with the step's device part (future-token fill,
forward, sampling) on a worker thread; configurations alternate round by round.

    .venv/bin/python bench/overlap_cpu_thread.py [--batch 1 16] [--tokens 64] [--rounds 3] [--set k=v]

The worker-thread runner lives here, not in rillet: it is the experiment, and what it measured
decided that `auto` leaves overlap off for CPU models (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
from rillet.core.config import config_from_dict
from rillet.core.engine.scheduler import ScheduledBatch
from rillet.core.llm import LLM
from rillet.core.runner.base import SampleResult
from rillet.core.runner.model_runner import ModelRunner
from rillet.core.runner.step_inputs import StepInputs
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq

from bench.lib.common import peak_rss_mib, table, write_json

PROMPTS = [f"Write a short story number {i} about a robot who learns to paint." for i in range(64)]


@dataclass
class _Pending:
    seqs: list[Seq]
    future: Future[SampleResult]

    def wait(self) -> SampleResult:
        return self.future.result()


class WorkerThreadRunner:
    """Inputs are built on the engine thread (they read sequence state it owns); the rest of the
    step runs on one worker thread, in launch order, as a device stream would run it."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="rillet-device")

    def launch(self, batch: ScheduledBatch) -> _Pending:
        inp = self.runner.inputs.build(batch)
        return _Pending(inp.sample_seqs, self.worker.submit(self._device, inp))

    def _device(self, inp: StepInputs) -> SampleResult:
        r = self.runner
        with torch.inference_mode():
            r.inputs.resolve_future(inp)
            hidden = r._hidden(inp)
            if not inp.sample_seqs:
                return SampleResult([], [])
            sample = r.sampler.sample_device(r.model.compute_logits(hidden), inp.sample_seqs)
            r.inputs.store_sampled(inp, sample.tokens)
            return sample.start_copy().wait()

    def release(self, seq: Seq) -> None:
        self.runner.release(seq)

    def poll(self) -> None:
        self.runner.poll()

    def close(self) -> None:
        self.worker.shutdown(wait=False)
        self.runner.close()


def rate(llm: LLM, batch: int, tokens: int, offset: int) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(PROMPTS[offset : offset + batch], params)
    dt = time.perf_counter() - t0
    return sum(len(o.outputs[0].token_ids) for o in outs) / dt


def make(mode: str, overrides: list[str]) -> LLM:
    cfg = config_from_dict(
        {"model": {"device": "cpu"}, "cache": {"num_blocks": 1024}, "engine": {"overlap": mode}}, overrides
    )
    llm = LLM(cfg)
    if mode == "on":
        core = llm.engine.core
        assert isinstance(core.runner, ModelRunner)
        core.runner = WorkerThreadRunner(core.runner)  # type: ignore[assignment]
    return llm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], help="config overrides")
    ap.add_argument("--out", default="bench/out/overlap_cpu_thread.json")
    a = ap.parse_args()
    llms = {"off": make("off", a.set), "on (worker thread)": make("on", a.set)}
    rows = []
    try:
        for batch in a.batch:
            got: dict[str, list[float]] = {name: [] for name in llms}
            for llm in llms.values():
                rate(llm, batch, 8, 0)  # warm-up
            for r in range(a.rounds):
                order = list(llms) if r % 2 == 0 else list(reversed(llms))
                for name in order:
                    got[name].append(rate(llms[name], batch, a.tokens, batch * (1 + r) % 48))
            base = got["off"]
            for name, xs in got.items():
                ratios = [x / b for x, b in zip(xs, base, strict=True)]
                rows.append(
                    {
                        "batch": batch,
                        "engine": name,
                        "tok_s_median": statistics.median(xs),
                        "vs_off_median": statistics.median(ratios),
                        "vs_off_min": min(ratios),
                        "vs_off_max": max(ratios),
                        "runs": xs,
                    }
                )
                print(f"  batch {batch} {name}: {[round(x, 1) for x in xs]} tok/s", flush=True)
    finally:
        for llm in llms.values():
            llm.close()
    write_json(a.out, {"tokens": a.tokens, "rounds": a.rounds, "rows": rows, "peak_rss_mib": peak_rss_mib()})
    print(f"peak RSS {peak_rss_mib():.0f} MiB (both engines); {a.tokens} tokens a request; {a.rounds} rounds")
    print(table(rows, ["batch", "engine", "tok_s_median", "vs_off_median", "vs_off_min", "vs_off_max"]))


if __name__ == "__main__":
    main()
