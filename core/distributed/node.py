"""`rillet worker`: the ranks of one more host (parallel.node_rank > 0).

It connects to rank 0's store (parallel.master_addr / master_port), takes rank 0's config from
it (one source of truth: the model, dtype and sizes cannot disagree between hosts; the model file
must exist at the same path on every host, as with vLLM), starts this host's ranks
(node_rank * ranks_per_node ...) and waits for them. It exits 0 when every rank was stopped by
rank 0, non-zero when one failed (the others are then killed: the group cannot go on without it).
SIGTERM/SIGINT end this host's ranks, which rank 0 sees as a dead rank.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from multiprocessing.process import BaseProcess
from types import FrameType

from rillet.core.config import ConfigError, RilletConfig, config_from_dict
from rillet.core.distributed.cluster import spawn_worker
from rillet.core.distributed.liveness import describe_exit, store_client

log = logging.getLogger(__name__)

_POLL_S = 0.2


def head_config(cfg: RilletConfig) -> RilletConfig:
    """Rank 0's config, read from its store (waits up to parallel.init_timeout_s for it)."""
    p = cfg.parallel
    if p.node_rank == 0:
        raise ConfigError("parallel.node_rank", "host 0 runs `rillet serve`; `rillet worker` needs 1 or more")
    log.info("connecting to rank 0 at %s:%d", p.master_addr, p.master_port)
    store = store_client(p.master_addr, p.master_port, p.init_timeout_s)
    head = config_from_dict(json.loads(store.get("config")))
    for key in ("tensor_parallel_size", "nnodes"):
        mine, theirs = getattr(p, key), getattr(head.parallel, key)
        if mine != theirs:
            raise ConfigError(f"parallel.{key}", f"is {mine} here but {theirs} on rank 0's host")
    return head


def run_node(cfg: RilletConfig) -> int:
    head = head_config(cfg)
    p = cfg.parallel
    per_node = head.parallel.ranks_per_node
    ranks = range(p.node_rank * per_node, (p.node_rank + 1) * per_node)
    procs = {r: spawn_worker(head, r, i, p.master_addr, p.master_port) for i, r in enumerate(ranks)}
    log.info("host %d: ranks %s", p.node_rank, ", ".join(f"{r} (pid {q.pid})" for r, q in procs.items()))
    stopping: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return _supervise(procs, stopping)


def _supervise(procs: dict[int, BaseProcess], stopping: list[int]) -> int:
    failed = False
    while any(q.exitcode is None for q in procs.values()):
        if stopping:
            log.info("%s: stopping this host's ranks", signal.Signals(stopping[0]).name)
            _terminate(procs)
            return 1
        for rank, q in procs.items():
            if q.exitcode not in (None, 0) and not failed:
                log.error("rank %d %s: stopping this host's other ranks", rank, describe_exit(q.exitcode))
                failed = True
                _terminate(procs)
        time.sleep(_POLL_S)
    failed = failed or any(q.exitcode != 0 for q in procs.values())
    log.info("ranks ended: %s", ", ".join(f"{r} {describe_exit(q.exitcode)}" for r, q in procs.items()))
    return 1 if failed else 0


def _terminate(procs: dict[int, BaseProcess]) -> None:
    for q in procs.values():
        if q.exitcode is None:
            q.terminate()
    deadline = time.monotonic() + 5.0
    for q in procs.values():
        q.join(max(0.0, deadline - time.monotonic()))
        if q.exitcode is None:
            q.kill()
            q.join(5.0)
