"""A worker rank (1..N-1): load its shard, report to rank 0, then run every step rank 0 sends.

Entry point of the processes rank 0 (cluster.py) and `rillet worker` (node.py) start with
torch.multiprocessing's spawn. Protocol with rank 0, through its TCPStore:
  status/<rank> = "ok <kv blocks this rank could hold>" | "error <why>"   (after loading)
  plan          = "<kv blocks>" | "abort"                                 (rank 0's decision)
  error/<rank>  = "<why>"                                                 (a failed step)
then init_process_group, the KV cache and runner, and the step loop until rank 0 says stop.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from datetime import timedelta

import torch
from rillet.core.build import kv_capacity, model_runner, resolve_device, resolve_precision, resolve_source
from rillet.core.config import RilletConfig
from rillet.core.distributed.comm import TPGroup
from rillet.core.distributed.liveness import Heartbeat, die_with_parent, store_client
from rillet.core.distributed.plan import ShardPlan
from rillet.core.distributed.shard_load import load_shard, read_arch
from rillet.core.model.decoder import DecoderModel
from torch._C._distributed_c10d import Store

log = logging.getLogger(__name__)

EXIT_FAILED = 1


def status_key(rank: int) -> str:
    return f"status/{rank}"


def error_key(rank: int) -> str:
    return f"error/{rank}"


def set_threads(cfg: RilletConfig, device: torch.device) -> None:
    """CPU: the ranks of one host share its cores (unless model.num_threads says otherwise)."""
    if cfg.model.num_threads is not None:
        torch.set_num_threads(cfg.model.num_threads)
    elif device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.parallel.ranks_per_node))


def local_device(cfg: RilletConfig, local_rank: int) -> torch.device:
    device = resolve_device(cfg.model.device)
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return device


def worker_main(cfg: RilletConfig, rank: int, local_rank: int, addr: str, port: int, parent_pid: int) -> None:
    """The spawned process's target. Exits 0 after rank 0's stop, non-zero on any failure."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: rank 0 decides
    die_with_parent(parent_pid)
    logging.basicConfig(
        level=getattr(logging, cfg.logging.level),
        format=f"%(asctime)s %(levelname)-7s rank {rank} %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    p = cfg.parallel
    store = store_client(addr, port, p.init_timeout_s)
    heartbeat = Heartbeat(addr, port, rank, min(1.0, p.liveness_timeout_s / 5))
    try:
        _run(cfg, store, rank, local_rank)
    finally:
        heartbeat.stop()


def _run(cfg: RilletConfig, store: Store, rank: int, local_rank: int) -> None:
    p = cfg.parallel
    try:
        device = local_device(cfg, local_rank)
        set_threads(cfg, device)
        model, dtype = _load(cfg, rank, device)
        capacity = kv_capacity(cfg, model.arch, dtype, device)
    except BaseException as exc:
        log.exception("loading failed")
        store.set(status_key(rank), f"error {type(exc).__name__}: {exc}")
        sys.exit(EXIT_FAILED)
    store.set(status_key(rank), f"ok {capacity}")
    store.set_timeout(timedelta(seconds=p.init_timeout_s))
    plan = store.get("plan").decode()
    if plan == "abort":  # another rank (or rank 0 itself) failed to load
        log.error("rank 0 abandoned the start")
        sys.exit(EXIT_FAILED)
    try:
        _serve(cfg, store, rank, device, dtype, model, int(plan))
    except BaseException as exc:
        log.exception("step failed")
        store.set(error_key(rank), f"{type(exc).__name__}: {exc}")
        sys.exit(EXIT_FAILED)


def _load(cfg: RilletConfig, rank: int, device: torch.device) -> tuple[DecoderModel, torch.dtype]:
    src = resolve_source(cfg)
    precision = resolve_precision(cfg, src, device)
    plan = ShardPlan(read_arch(cfg, src.kind, src.path, src.header), cfg.parallel.tensor_parallel_size, rank)
    model = load_shard(
        cfg, src.kind, src.path, src.header, device, precision.dtype, precision.quantization, plan
    )
    return model, precision.dtype


@torch.inference_mode()
def _serve(
    cfg: RilletConfig,
    store: Store,
    rank: int,
    device: torch.device,
    dtype: torch.dtype,
    model: DecoderModel,
    num_blocks: int,
) -> None:
    group = TPGroup(cfg, store, rank, device, cfg.cache.block_size)
    try:
        group.attach(model)
        runner = model_runner(cfg, model, num_blocks, (), device, dtype)
        log.info("ready: %d KV blocks", num_blocks)
        steps = 0
        while (inp := group.recv_step()) is not None:
            runner._hidden(inp)  # rank 0's forward on the same inputs; the output rows are rank 0's
            steps += 1
        log.info("stopped by rank 0 after %d steps", steps)
    finally:
        group.close()
