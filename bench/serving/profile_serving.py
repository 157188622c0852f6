"""Where the server's threads spend a busy serving run: py-spy on a rillet server under load.

Starts a server (by default the null engine: 5 ms steps, no compute), opens `--streams`
concurrent requests (streaming or not), samples the server with `py-spy record --threads` for the
length of the run, and prints the top entries per thread: self time (the line that was running)
and inclusive time (any frame on the stack). The raw samples are kept (py-spy's collapsed format).

    .venv/bin/python bench/profile_serving.py --streams 256 --tokens 800 [--non-stream] [--set k=v]

py-spy needs ptrace rights on the server process (root, or kernel.yama.ptrace_scope = 0).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.lib.loadgen import run_level
from bench.lib.server_proc import RilletServer
from bench.serving.null_engine import null_engine_overrides
from bench.serving.serve_sweep import served_model


def summarize(raw: Path, top: int) -> str:
    """Top self and inclusive entries per thread from py-spy's collapsed (`-f raw`) output."""
    self_n: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    incl: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    per_thread: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        thread, n = frames[0], int(count)
        per_thread[thread] += n
        if len(frames) > 1:
            self_n[thread][frames[-1]] += n
        for frame in set(frames[1:]):
            incl[thread][frame] += n
    total = sum(per_thread.values()) or 1
    out = [f"{total} samples"]
    for thread, n in per_thread.most_common():
        out.append(f"\n== {thread}: {n} samples ({100 * n / total:.1f} %)")
        out.append("  self:")
        out += [f"    {k:6d} {100 * k / total:5.1f} %  {f}" for f, k in self_n[thread].most_common(top)]
        out.append("  inclusive:")
        out += [f"    {k:6d} {100 * k / total:5.1f} %  {f}" for f, k in incl[thread].most_common(top)]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=800)
    ap.add_argument("--non-stream", action="store_true")
    ap.add_argument("--seconds", type=float, default=12.0, help="sampling window")
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--set", action="append", default=[], help="config override (after the null-engine ones)")
    ap.add_argument("--out", default="bench/out/profile_serving.txt")
    a = ap.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    raw = Path(a.out).with_suffix(".raw")
    raw.parent.mkdir(parents=True, exist_ok=True)
    with RilletServer([*null_engine_overrides(a.streams, a.tokens), *a.set]) as srv:
        model = served_model(srv.base_url, "auto")
        asyncio.run(run_level(srv.base_url, model, 4, 8, 16, True))  # warm-up
        assert srv.proc is not None
        args = [spy, "record", "-p", str(srv.proc.pid), "--threads", "-r", str(a.rate)]
        rec = subprocess.Popen(
            [*args, "-f", "raw", "-o", str(raw), "-d", str(int(a.seconds))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # py-spy attaches
        res = asyncio.run(run_level(srv.base_url, model, a.streams, a.streams, a.tokens, not a.non_stream))
        rec.wait()
    mode = "non-streaming" if a.non_stream else "streaming"
    head = f"{a.streams} {mode} requests x {a.tokens} tokens: {res.tokens / res.wall_s:.0f} tok/s"
    report = head + " (py-spy attached)\n" + summarize(raw, a.top)
    Path(a.out).write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
