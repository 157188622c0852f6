"""The tensor-parallel process group of one rank: the all-reduce the model calls, and the step
broadcast from rank 0.

The all-reduce is torch's functional collective (`_c10d_functional.all_reduce` + `wait_tensor`):
the same op runs eagerly and traces into a torch.compile / CUDA-graph capture (fullgraph), so
every rank can run one compiled decode graph with the collectives inside it.

Step inputs travel as two broadcasts from rank 0: a fixed 8-int header, then the payload
(step_io.py). Gloo (CPU) carries both. With NCCL the header and the host copies go over a gloo
group of the same ranks (the receiver needs them on the host), the payload over NCCL.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import torch
import torch.distributed as dist
from rillet.core.config import RilletConfig
from rillet.core.distributed import step_io
from rillet.core.model.decoder import DecoderModel
from rillet.core.model.decoder_layer import DecoderLayer
from rillet.core.runner.step_inputs import StepInputs
from torch._C._distributed_c10d import PrefixStore, Store

log = logging.getLogger(__name__)

# A worker's wait for the next step's header: not a collective in flight but the server's idle
# time, unbounded (rank 0 gone ends the worker through its heartbeat, liveness.py). Under the
# group's parallel.timeout_s an engine idle that long lost its workers and died. A year: gloo
# adds the timeout to a nanosecond clock, where a larger one could overflow.
_NEXT_STEP_WAIT = timedelta(days=365)


def resolve_backend(setting: str, device: torch.device) -> str:
    if setting == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    return setting


class TPGroup:
    """Created once per process, on every rank (init_process_group's default group)."""

    def __init__(
        self, cfg: RilletConfig, store: Store, rank: int, device: torch.device, block_size: int
    ) -> None:
        self.rank, self.world_size = rank, cfg.parallel.tensor_parallel_size
        self.device, self.block_size = device, block_size
        backend = resolve_backend(cfg.parallel.backend, device)
        if dist.is_initialized():
            raise RuntimeError("a tensor-parallel engine is already running in this process")
        dist.init_process_group(
            backend,
            store=PrefixStore("tp/", store),
            rank=rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=cfg.parallel.timeout_s),
        )
        world = dist.group.WORLD
        assert world is not None
        self.group_name: str = world.group_name
        # the host-side control channel: the world itself with gloo, a gloo twin with NCCL
        self.cpu_group = world if backend == "gloo" else dist.new_group(backend="gloo")
        self.split_host = backend != "gloo"
        self._head = torch.zeros(step_io.HEADER, dtype=torch.int64)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.ops._c10d_functional.all_reduce(x, "sum", self.group_name)
        return torch.ops._c10d_functional.wait_tensor(out)

    def attach(self, model: DecoderModel) -> None:
        """The model's row-parallel outputs go through this group's all-reduce."""
        for layer in model.layers:
            assert isinstance(layer, DecoderLayer)
            layer.all_reduce = self.all_reduce

    # ---- rank 0 --------------------------------------------------------------------------------
    def send_step(self, inp: StepInputs) -> None:
        dist.broadcast(step_io.header(step_io.STEP, inp), 0, group=self.cpu_group)
        if self.split_host:
            qs = [0]
            for n in inp.meta.query_lens_cpu:
                qs.append(qs[-1] + n)
            host = torch.tensor(qs + inp.meta.seq_lens_cpu, dtype=torch.int64)
            dist.broadcast(host, 0, group=self.cpu_group)
        dist.broadcast(step_io.pack(inp), 0)

    def send_stop(self) -> None:
        dist.broadcast(step_io.header(step_io.STOP), 0, group=self.cpu_group)

    # ---- the other ranks -----------------------------------------------------------------------
    def recv_step(self) -> StepInputs | None:
        """The next step's inputs; None when rank 0 says stop."""
        head = self._head
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor, opts.timeout = 0, 0, _NEXT_STEP_WAIT
        self.cpu_group.broadcast([head], opts).wait()
        if int(head[0]) == step_io.STOP:
            return None
        b = int(head[2])
        payload = torch.empty(step_io.payload_size(head), dtype=torch.int64, device=self.device)
        host = payload
        if self.split_host:
            host = torch.empty(2 * b + 1, dtype=torch.int64)
            dist.broadcast(host, 0, group=self.cpu_group)
        dist.broadcast(payload, 0)
        return step_io.unpack(head, payload, host, self.block_size)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
