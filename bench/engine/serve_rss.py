"""Memory of `rillet serve` on the default model: the peak of the load against the steady state.

Starts `rillet serve` (its own defaults: a 1 GiB KV pool, the compiled step saved under
`model.cache_dir`), samples the server's VmRSS every 0.1 s, and notes VmHWM once /health answers
(the load's peak), then waits for the compiled step to be in use (its log line), sends a few chat
requests and reads VmRSS again (steady state) and VmHWM (the peak of the whole run). Run it twice
on one cache folder to see a warm start (the saved step loaded, not built).

    nice -n 19 .venv/bin/python -m bench.engine.serve_rss [--cache-dir DIR] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

IN_USE = ("compiled graph in use", "compiled step is", "stays eager", "compiled decode off")


def status_mib(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> int:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def measure(overrides: list[str], cache_dir: str, timeout_s: float) -> dict[str, Any]:
    port = free_port()
    cmd = [sys.executable, "-m", "rillet.http.cli", "serve", "--port", str(port)]
    cmd += [f"--set=model.cache_dir={cache_dir}", *[f"--set={s}" for s in overrides]]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    in_use = threading.Event()

    def read_log() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip())
            if any(k in line for k in IN_USE):
                in_use.set()

    threading.Thread(target=read_log, daemon=True).start()
    samples: list[float] = []
    base = f"http://127.0.0.1:{port}"
    try:
        while get(f"{base}/health", timeout=2) != 200:
            samples.append(status_mib(proc.pid)["VmRSS"])
            if proc.poll() is not None or time.perf_counter() - start > timeout_s:
                raise RuntimeError("server did not start:\n" + "\n".join(lines[-30:]))
            time.sleep(0.1)
        ready = time.perf_counter() - start
        at_ready = status_mib(proc.pid)
        in_use.wait(timeout_s)
        compiled = time.perf_counter() - start
        chat = {
            "model": "x",
            "messages": [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": 32,
        }
        for _ in range(4):
            get(f"{base}/v1/chat/completions", {**chat, "model": _model(base)})
        end = status_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(60)
    return {
        "ready_s": ready,
        "compiled_in_use_s": compiled,
        "load_peak_mib": at_ready["VmHWM"],
        "rss_at_ready_mib": at_ready["VmRSS"],
        "steady_rss_mib": end["VmRSS"],
        "run_peak_mib": end["VmHWM"],
        "load_peak_over_steady": at_ready["VmHWM"] / end["VmRSS"],
        "compiled_line": next((ln for ln in lines if any(k in ln for k in IN_USE)), None),
    }


def _model(base: str) -> str:
    with urllib.request.urlopen(f"{base}/v1/models", timeout=10) as r:
        return str(json.loads(r.read())["data"][0]["id"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--set", action="append", default=[], help="rillet config override")
    ap.add_argument("--cache-dir", help="model.cache_dir (default: a fresh temporary folder)")
    ap.add_argument("--runs", type=int, default=2, help="starts on one cache folder (cold, then warm)")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--out", default="bench/out/serve_rss.json")
    a = ap.parse_args()
    from bench.lib.common import table, write_json

    with tempfile.TemporaryDirectory(prefix="rillet-rss-") as tmp:
        cache = a.cache_dir or tmp
        rows = []
        for i in range(a.runs):
            rows.append(
                {"run": "cold" if i == 0 and not a.cache_dir else "warm", **measure(a.set, cache, a.timeout)}
            )
            print(json.dumps(rows[-1]), flush=True)
    write_json(a.out, {"overrides": a.set, "rows": rows})
    print(table(rows, [c for c in rows[0] if c != "compiled_line"]))


if __name__ == "__main__":
    main()
