"""`rillet fleet --replicas N`: N `rillet serve` replicas of one config on consecutive ports behind
a cache-aware router (http/launch/routers.py), all on this machine, for trying a fleet and for
tests (docs/fleet.md).

Ports: the router on server.port (P), replica i on P + 1 + i, the router's Prometheus exporter on
P + N + 1. Every child runs in a process group of its own, so a terminal's Ctrl-C reaches this
process only, which stops the router, then the replicas (SIGTERM, then SIGKILL after a grace
period) and waits for each: no child outlives the fleet, nor gets a second signal mid-drain.
Children also get SIGTERM from the kernel if this process dies without stopping them (Linux).
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

from rillet.http.launch.routers import RouterPlan, router_command

log = logging.getLogger("rillet.fleet")

READY_TIMEOUT_S = 600.0  # a large model's load; a replica that exits fails the fleet at once
STOP_GRACE_S = 30.0
POLL_S = 0.2
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class FleetPlan:
    """What `rillet fleet` starts: the replicas' shared `rillet serve` arguments and the router."""

    replicas: int
    host: str
    port: int
    serve_args: tuple[str, ...]  # --config / --set arguments every replica gets
    router: str
    policy: str
    router_args: tuple[str, ...] = ()

    def replica_port(self, i: int) -> int:
        return self.port + 1 + i

    def replica_url(self, i: int) -> str:
        return f"http://{_connect_host(self.host)}:{self.replica_port(i)}"

    def router_plan(self) -> RouterPlan:
        return RouterPlan(
            name=self.router,
            host=self.host,
            port=self.port,
            metrics_port=self.port + self.replicas + 1,
            worker_urls=tuple(self.replica_url(i) for i in range(self.replicas)),
            policy=self.policy,
            extra_args=self.router_args,
        )


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]


@dataclass
class Fleet:
    """The running children, in start order; stop() ends them router first."""

    children: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str]) -> Child:
        log.info("starting %s: %s", name, " ".join(argv))
        proc = subprocess.Popen(list(argv), process_group=0, preexec_fn=_die_with_parent)
        child = Child(name, proc)
        self.children.append(child)
        return child

    def stop(self) -> None:
        for child in reversed(self.children):  # the router first: no request reaches a stopping replica
            _signal(child, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for child in reversed(self.children):
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s: killed", child.name, STOP_GRACE_S)
                _signal(child, signal.SIGKILL)
                child.proc.wait()


def _connect_host(host: str) -> str:
    """The address the router dials for a replica listening on `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the fleet process dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _signal(child: Child, sig: signal.Signals) -> None:
    if child.proc.poll() is None:
        child.proc.send_signal(sig)


def replica_command(plan: FleetPlan, i: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rillet.http.cli",
        "serve",
        *plan.serve_args,
        "--set",
        f"server.host={plan.host}",
        "--set",
        f"server.port={plan.replica_port(i)}",
    ]


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_until(ready: Callable[[], bool], children: Sequence[Child], stopping: Callable[[], bool]) -> bool:
    """Polls `ready` until it holds (True), a child exits or a stop is asked (False)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and not stopping():
        for child in children:
            if child.proc.poll() is not None:
                log.error("%s exited with code %s while starting", child.name, child.proc.returncode)
                return False
        if ready():
            return True
        time.sleep(POLL_S)
    return False


class StopFlag:
    """SIGINT / SIGTERM set it; the fleet's loops read it between polls."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self) -> bool:
        return self.signum is not None

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = signum


def run_fleet(plan: FleetPlan, say: Callable[[str], None]) -> int:
    """Starts the replicas, then the router; returns when a signal asks or the router dies,
    every child stopped and reaped. 0 on a signal, 1 when something failed."""
    stop = StopFlag()
    previous = {s: signal.signal(s, stop.handle) for s in (signal.SIGINT, signal.SIGTERM)}
    fleet = Fleet()
    try:
        return _run(plan, fleet, stop, say)
    finally:
        fleet.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _run(plan: FleetPlan, fleet: Fleet, stop: StopFlag, say: Callable[[str], None]) -> int:
    replicas = [fleet.start(f"replica {i}", replica_command(plan, i)) for i in range(plan.replicas)]
    urls = [plan.replica_url(i) for i in range(plan.replicas)]
    if not wait_until(lambda: all(http_ok(f"{u}/health") for u in urls), replicas, stop):
        return 0 if stop() else 1
    rplan = plan.router_plan()
    router = fleet.start(plan.router, router_command(rplan))
    base = f"http://{_connect_host(plan.host)}:{plan.port}"
    if not wait_until(lambda: http_ok(f"{base}/v1/models"), [router], stop):
        return 0 if stop() else 1
    say(f"fleet ready: {base}/v1 ({plan.router}, policy {plan.policy}) in front of {', '.join(urls)}")
    say(f"router metrics: http://{_connect_host(plan.host)}:{rplan.metrics_port}/metrics; Ctrl-C stops all")
    return _watch(router, replicas, stop)


def _watch(router: Child, replicas: list[Child], stop: StopFlag) -> int:
    """Until a signal: a replica that exits is left to the router to route around; the router's
    exit, or every replica's, ends the fleet."""
    gone: set[str] = set()
    while not stop():
        if router.proc.poll() is not None:
            log.error("%s exited with code %s: stopping the fleet", router.name, router.proc.returncode)
            return 1
        for r in replicas:
            if r.proc.poll() is not None and r.name not in gone:
                gone.add(r.name)
                log.warning("%s exited with code %s; the router routes around it", r.name, r.proc.returncode)
        if len(gone) == len(replicas):
            log.error("every replica exited: stopping the fleet")
            return 1
        time.sleep(POLL_S)
    log.info("signal %s: stopping the router and %d replicas", stop.signum, len(replicas))
    return 0
