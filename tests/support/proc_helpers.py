"""`rillet serve` as a subprocess on a free loopback port, its stderr collected on a thread."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from repo import REPO

RILLET = Path(sys.executable).with_name("rillet")


class RilletProcess:
    """`rillet <command> --set ...` as a subprocess; stderr collected on a thread, the port read
    from the server's "listening on" line."""

    def __init__(
        self,
        command: str,
        *sets: str,
        env: dict[str, str] | None = None,
        faults: dict[str, str] | None = None,
    ) -> None:
        """`faults`: environment variables of faulty_rillet.py, which then runs in place of `rillet`."""
        launcher = (
            [str(RILLET)]
            if not faults
            else [sys.executable, str(Path(__file__).with_name("faulty_rillet.py"))]
        )
        env = {**(env or {}), **(faults or {})}
        args = [*launcher, command]
        if command == "serve":
            args += ["--port", "0"]
        for s in sets:
            args += ["--set", s]
        self.proc = subprocess.Popen(
            args, stderr=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, **(env or {})}
        )
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self.host, self.port = "127.0.0.1", 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            self.lines.append(line)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, self.log
            assert time.monotonic() < deadline, self.log
            time.sleep(0.05)

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class ServeProcess(RilletProcess):
    """`rillet serve` on the synthetic model unless `sets` say otherwise; by default, returned
    once the server is ready."""

    def __init__(
        self,
        *sets: str,
        env: dict[str, str] | None = None,
        faults: dict[str, str] | None = None,
        ready: bool = True,
    ) -> None:
        super().__init__("serve", "model.kind=synthetic", *sets, env=env, faults=faults)
        if ready:
            self.wait_for_line("ready: serving", 180)  # a hang bound: a loaded box starts slowly
