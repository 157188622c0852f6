"""Start llama.cpp's `llama-server` in a subprocess for a benchmark (the binary built as
bench/README.md says), wait until its model is loaded, read its peak RSS: the counterpart of
server_proc.RilletServer for a side-by-side run."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from bench.lib.server_proc import free_port, peak_rss_mib


class LlamaServer:
    def __init__(
        self,
        binary: str,
        args: Sequence[str],
        port: int | None = None,
        cpus: set[int] | None = None,
        log_path: str | None = None,
    ) -> None:
        """`args`: llama-server's own flags (model, threads, slots, context); `cpus`: pin it."""
        self.binary = binary
        self.args = list(args)
        self.port = port or free_port()
        self.cpus = cpus
        self.log_path = log_path or f"bench/out/llama-server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> LlamaServer:
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        cmd = [self.binary, *self.args, "--host", "127.0.0.1", "--port", str(self.port)]
        cpus = self.cpus

        def pin() -> None:  # in the child, before exec: its threads inherit it
            if cpus:
                os.sched_setaffinity(0, cpus)

        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin)
        self._wait_healthy(300)
        return self

    def _wait_healthy(self, timeout: float) -> None:
        # /health answers 503 while the model loads, 200 once requests are served
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.HTTPError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"llama-server not healthy after {timeout} s; see {self.log_path}")

    def peak_rss_mib(self) -> float | None:
        return peak_rss_mib(self.proc.pid) if self.proc is not None else None

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
