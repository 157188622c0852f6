"""The record of one GPU check run (bench/gpu/check.py) and its time budget: `Results` (every
part's numbers and table rows, written as JSON after each part, and the table printed last),
`run_part` (one part, skipped when the budget cannot fit it, marked FAIL when it raises), the
watchdog that prints the table and exits past the budget, and `setup_seconds` (the time spent
before the script, which the budget counts)."""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu.plan import Part, Plan, row
from bench.lib.common import peak_rss_mib, table, write_json

COLS = ["part", "measured", "target", "floor / ref", "verdict", "note"]


@dataclass
class Results:
    path: Path
    plan: Plan
    parts: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    current: str = ""
    cuda_peak_gib: float = 0.0
    setup_s: float = 0.0  # spent before this script started (install, import check): in the budget
    start: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.start -= self.setup_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def time_left(self) -> float:
        return self.plan.budget_s - self.elapsed()

    def write(self) -> None:
        summary = {
            "elapsed_s": self.elapsed(),
            "setup_s": self.setup_s,
            "budget_s": self.plan.budget_s,
            "cuda_peak_gib": self.cuda_peak_gib,
            "rss_peak_mib": peak_rss_mib(),
        }
        write_json(
            self.path,
            {"plan": self.plan.to_json(), "summary": summary, "parts": self.parts, "table": self.rows},
        )

    def final_rows(self) -> list[dict[str, Any]]:
        mem = f"GPU {self.cuda_peak_gib:.1f} GiB" if self.plan.device == "cuda" else "GPU n/a"
        return [
            *self.rows,
            row("memory / time", f"{mem}, RSS {peak_rss_mib():.0f} MiB, {self.elapsed():.0f} s"),
        ]

    def report(self) -> str:
        lines = [f"gpu_check ({self.plan.device}, {time.strftime('%Y-%m-%d %H:%M %Z')}); JSON: {self.path}"]
        return "\n".join([*lines, table(self.final_rows(), COLS)])


def run_part(res: Results, name: str, need_s: float, fn: Any) -> Any:
    """Runs fn() -> Part unless the budget cannot fit `need_s`; records rows, timing, GPU peak."""
    left = res.time_left()
    if left < need_s:
        res.parts[name] = {"status": "SKIP", "why": f"{left:.0f} s left < {need_s:.0f} s needed"}
        res.rows.append(
            row(name, verdict="SKIP", note=f"time budget: {left:.0f} s left, needs ~{need_s:.0f}")
        )
        res.write()
        return None
    res.current = name
    cuda = res.plan.device == "cuda"
    if cuda:
        import torch

        torch.cuda.reset_peak_memory_stats()
    t0 = time.monotonic()
    print(f"[{res.elapsed():6.1f} s] {name} ...", file=sys.stderr, flush=True)
    try:
        part: Part = fn()
        res.parts[name] = {"status": "OK", **part.data}
        res.rows.extend(part.rows)
        return part.value
    except Exception as exc:
        import traceback

        res.parts[name] = {
            "status": "FAIL",
            "error": f"{type(exc).__name__}: {exc}",
            "trace": traceback.format_exc(),
        }
        res.rows.append(row(name, verdict="FAIL", note=f"{type(exc).__name__}: {str(exc)[:150]}"))
        return None
    finally:
        res.parts.setdefault(name, {})["seconds"] = time.monotonic() - t0
        if cuda:
            import torch

            peak = torch.cuda.max_memory_allocated() / 2**30
            res.parts[name]["cuda_peak_gib"] = peak
            res.cuda_peak_gib = max(res.cuda_peak_gib, peak)
        res.current = ""
        res.write()


def start_watchdog(res: Results) -> threading.Timer:
    """Past the budget plus grace: record the overrun, print the table, leave at once."""

    def fire() -> None:
        res.rows.append(row(res.current or "?", verdict="FAIL", note="watchdog: budget overrun, stopped"))
        try:
            res.write()  # the main thread may be mid-update: the table below matters more
        except Exception as exc:
            print(f"watchdog: JSON not written ({exc})", file=sys.stderr)
        print(res.report(), flush=True)
        os._exit(3)

    timer = threading.Timer(max(1.0, res.plan.budget_s + res.plan.grace_s - res.elapsed()), fire)
    timer.daemon = True
    timer.start()
    return timer


def setup_seconds() -> float:
    """Seconds since run.sh started (GPU_RUN_START, epoch seconds), else 0."""
    t0 = os.environ.get("GPU_RUN_START", "")
    try:
        return max(0.0, time.time() - float(t0)) if t0 else 0.0
    except ValueError:
        return 0.0
