"""Start a rillet server in a subprocess for a benchmark, wait until it is healthy, read its peak RSS."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



def peak_rss_mib(pid: int) -> float | None:
    """VmHWM of a process, in MiB (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None

class RilletServer:
    def __init__(
        self,
        overrides: list[str],
        port: int | None = None,
        log_path: str | None = None,
        cpus: set[int] | None = None,
        python: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """`cpus`: pin the server (every thread it starts) to these cores; `python`: the
        interpreter whose rillet to serve (another checkout's venv, for a before/after); `env`:
        variables set for the server on top of this process's."""
        self.cpus = cpus
        self.env = env or {}
        self.python = python or sys.executable
        self.port = port or free_port()
        self.overrides = overrides
        self.log_path = log_path or f"bench/out/server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.decode_path = "unknown"  # "compiled" | "eager", once started

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> RilletServer:
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        args = [self.python, "-m", "rillet.http.cli", "serve", "--port", str(self.port)]
        for o in self.overrides:
            args += ["--set", o]
        log = open(self.log_path, "wb")
        # cwd must not be the repo root: `python -m` puts the cwd first on sys.path.
        cpus = self.cpus

        def pin() -> None:  # in the child, before exec: every thread it starts inherits it
            if cpus:
                os.sched_setaffinity(0, cpus)

        env = dict(os.environ) | self.env
        out = subprocess.STDOUT
        self.proc = subprocess.Popen(args, stdout=log, stderr=out, cwd="/", env=env, preexec_fn=pin)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if r.status == 200:
                        self.decode_path = self._wait_compiled()
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not healthy after 180 s; see {self.log_path}")

    def _wait_compiled(self, timeout: float = 900) -> str:
        """A CPU server compiles its decode step in the background after /health is up: measure
        the step it will keep, so wait until the log says which (\"compiled\" or \"eager\")."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = Path(self.log_path).read_text(errors="replace")
            if "decode step: compiled (" not in text:
                return "eager" if "decode step: " in text else "unknown"
            # graphs.enabled on: in use once built; auto: once timed against eager (after the build)
            in_use = "compiled in use" in text or "compiled graph in use" in text
            if "decode step compiled in" in text and in_use:
                return "compiled"
            if "stays eager" in text or "compiled decode off" in text:
                return "eager"
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log_path}")
            time.sleep(0.5)
        raise TimeoutError(f"decode step not compiled after {timeout} s; see {self.log_path}")

    def peak_rss_mib(self) -> float | None:
        return None if self.proc is None else peak_rss_mib(self.proc.pid)

    def metric(self, name: str) -> float | None:
        """One sample of a Prometheus metric (the first line that starts with `name`)."""
        return scrape_metrics(f"http://127.0.0.1:{self.port}").get(name)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def scrape_metrics(server: str, timeout: float = 5.0) -> dict[str, float]:
    """A server's /metrics (`server`: http://host:port): each metric's first sample by its name
    (labels dropped)."""
    samples: dict[str, float] = {}
    with urllib.request.urlopen(f"{server}/metrics", timeout=timeout) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                samples.setdefault(line.split("{", 1)[0].split(" ", 1)[0], float(line.rsplit(" ", 1)[1]))
    return samples
