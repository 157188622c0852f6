"""Helpers shared by the benchmarks: where things are, peak memory, JSON output, the closing table.

Benchmarks are modules of the `bench` package, run from the repository root:
`.venv/bin/python -m bench.serving.null_engine ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "bench" / "out"  # default place of a benchmark's JSON (git-ignored)
TESTS_SUPPORT = REPO / "tests" / "support"
# Prompt words for multi-turn workloads: each its own token, so prompt lengths are predictable
WORDS = [
    "river",
    "stone",
    "lantern",
    "orchard",
    "copper",
    "meadow",
    "harbor",
    "violet",
    "thunder",
    "garden",
    "silver",
    "candle",
]


def words(rng: random.Random, n: int) -> str:
    """`n` of WORDS drawn by `rng`, space-separated."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


def use_test_support() -> None:
    """Makes tests/support's helpers importable by name (the raw HTTP client, engine hooks, the
    attack and fuzz libraries), as pytest's pythonpath does for the tests."""
    if str(TESTS_SUPPORT) not in sys.path:
        sys.path.insert(0, str(TESTS_SUPPORT))


def process_cpu(pid: int | None, task: int | None = None) -> float | None:
    """CPU seconds of a process, or of one of its threads (`task`: a thread id), from /proc: the
    scheduler's nanosecond count of a thread (schedstat), else the 10 ms ticks of stat.
    `rillet serve` runs its event loop on its main thread: `process_cpu(pid, pid)` is the loop's."""
    if pid is None:
        return None
    import os

    if task is not None:
        try:
            return int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            pass
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_user_cpu(pid: int | None, task: int) -> float | None:
    """User-mode CPU seconds of one thread (10 ms ticks, scaled by the kernel to its precise
    total): with `process_cpu(pid, task)` it splits the thread's time into its own code and the
    kernel's (syscalls: a loopback `send` also runs the receiver's TCP path in the sender's time)."""
    if pid is None:
        return None
    import os

    try:
        fields = Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) / os.sysconf("SC_CLK_TCK")


ENGINE_THREAD = "rillet-engine"  # the engine thread's OS name (core/thread_name.py)


def named_thread(pid: int | None, comm: str = ENGINE_THREAD) -> int | None:
    """The id of the process's first thread the OS knows by `comm`, if it has one. Threads a named
    thread starts inherit its name (the engine thread's OpenMP workers, its compile thread), and
    come later: the lowest id is the one that named itself."""
    if pid is None:
        return None
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    found = []
    for task in tasks:
        try:
            if (task / "comm").read_text().strip() == comm:
                found.append(int(task.name))
        except (OSError, ValueError):
            continue
    return min(found, default=None)


def thread_sched(pid: int | None, task: int | None) -> tuple[float, float] | None:
    """(CPU seconds, seconds runnable but waiting for a core) of one thread, from schedstat: on a
    core shared with the event loop, the engine's wait is the loop's work that came first."""
    if pid is None or task is None:
        return None
    try:
        run, wait = Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return int(run) / 1e9, int(wait) / 1e9


def parse_cpus(spec: str) -> set[int]:
    """A --server-cpus / --client-cpus value ("0" or "0,1") -> the cores."""
    return {int(c) for c in spec.split(",")}


def add_pinning(ap: argparse.ArgumentParser) -> None:
    """--server-cpus / --client-cpus: the seed's method pins the started server and this client
    to separate cores (`pin_client` applies them)."""
    ap.add_argument("--server-cpus", help="pin every started server to these cores (e.g. 0 or 0,1)")
    ap.add_argument("--client-cpus", help="pin this client to these cores (e.g. 1)")


def pin_client(args: argparse.Namespace) -> set[int] | None:
    """Pins this process to --client-cpus (if given); returns the cores for the servers it starts
    (None: anywhere)."""
    if args.client_cpus:
        os.sched_setaffinity(0, parse_cpus(args.client_cpus))
    return parse_cpus(args.server_cpus) if args.server_cpus else None


def peak_rss_mib() -> float:
    """Peak resident set size of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cuda_peak_mib() -> float | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def machine() -> dict[str, Any]:
    import os

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "argv": sys.argv,
    }


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Whole or not at all: a process killed mid-write (a device call's time limit) leaves the
    previous version, never a truncated file."""
    import os
    import threading

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f"{p.name}.{threading.get_ident()}.tmp")  # per thread: a watchdog writes too
    tmp.write_text(json.dumps({"machine": machine(), **data}, indent=2))
    os.replace(tmp, p)


def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    def fmt(v: Any) -> str:
        return (
            f"{v:.3f}"
            if isinstance(v, float) and abs(v) < 10
            else (f"{v:.1f}" if isinstance(v, float) else str(v))
        )

    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def decode_path(llm: Any) -> str:
    """Waits for a CPU engine's background compile of the decode step, so that what follows
    measures the step the engine keeps; "compiled" or "eager"."""
    gr = getattr(llm.engine.core.runner, "graph_runner", None)
    if gr is None or gr.compiled is None:
        return "eager"
    gr.compiled.wait()
    return "compiled" if gr.compiled.ready else "eager"


def hf_config_kwargs(arch: Any) -> dict[str, Any]:
    """A rillet ModelArch as the keyword arguments of a transformers Llama-family config."""
    return {
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "rms_norm_eps": arch.rms_norm_eps,
        "rope_theta": arch.rope_theta,
        "max_position_embeddings": arch.max_position,
        "tie_word_embeddings": arch.tie_word_embeddings,
    }
