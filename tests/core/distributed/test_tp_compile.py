"""The sharded forward, all-reduces included, compiles as ONE graph (torch.compile fullgraph=True:
a graph break fails it) on every rank, and gives the unsharded model's output. aot_eager keeps the
test fast: it is dynamo's capture that must hold the collectives; inductor compiles what it gets."""

from __future__ import annotations

import socket

import torch.multiprocessing as mp
from tp_compile_ranks import run_rank


def test_sharded_forward_compiles_with_collectives_inside() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    mp.spawn(run_rank, args=(2, port), nprocs=2, join=True)  # raises if any rank's assertion fails
