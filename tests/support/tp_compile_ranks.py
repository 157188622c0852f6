"""The ranks of test_tp_compile.py (a module of its own: spawned processes import their target)."""

from __future__ import annotations

from datetime import timedelta

import torch
from rillet.core.attention.base import AttentionMetadata
from rillet.core.attention.torch_backend import TorchAttentionBackend
from rillet.core.config import config_from_dict
from rillet.core.distributed.comm import TPGroup
from rillet.core.distributed.plan import ShardPlan
from rillet.core.model.decoder import DecoderModel, allocate_kv_cache, build_model
from rillet.core.model.shapes import SHAPES
from torch._C._distributed_c10d import TCPStore

BLOCK = 8


def _prefill_meta(t: int) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=torch.arange(BLOCK, BLOCK + t),
        query_start=torch.tensor([0, t], dtype=torch.int32),
        seq_lens=torch.tensor([t], dtype=torch.int32),
        block_tables=torch.tensor([[1, 2]], dtype=torch.int32),
        query_lens_cpu=[t],
        seq_lens_cpu=[t],
        block_size=BLOCK,
        num_prefills=1,
    )


def _forward(model: DecoderModel, ids: torch.Tensor, fn: object = None) -> torch.Tensor:
    kv = allocate_kv_cache(model.arch, 4, BLOCK, torch.float32, "cpu")
    run = fn if fn is not None else model
    return run(ids, torch.arange(ids.shape[0]), kv, _prefill_meta(ids.shape[0]))  # type: ignore[operator]


def run_rank(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    arch = SHAPES["tiny"]  # 4 query heads, 2 KV heads
    full = build_model(arch, TorchAttentionBackend(), torch.float32, "cpu")
    full.init_random(seed=0, std=0.2)
    plan = ShardPlan(arch, world, rank)
    local = build_model(plan.local_arch(), TorchAttentionBackend(), torch.float32, "cpu")

    def shard(name: str, whole: torch.Tensor) -> torch.Tensor:
        spec = plan.spec(name)
        if spec is None:
            return whole
        return whole[spec.start : spec.stop] if spec.dim == 0 else whole[:, spec.start : spec.stop]

    weights = [
        (name, shard(name, p.data[where] if where else p.data))
        for name, (p, where, _) in full.weight_targets().items()
        if plan.wanted(name)
    ]
    local.load_weights(weights)
    store = TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=60))
    cfg = config_from_dict({"parallel": {"tensor_parallel_size": world, "timeout_s": 60}})
    group = TPGroup(cfg, store, rank, torch.device("cpu"), BLOCK)
    try:
        group.attach(local)
        ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
        with torch.inference_mode():
            want = _forward(full, ids)
            eager = _forward(local, ids)
            compiled = torch.compile(local.forward, fullgraph=True, backend="aot_eager")
            graphed = _forward(local, ids, compiled)
        assert torch.allclose(eager, want, atol=1e-5), (eager - want).abs().max()
        assert torch.allclose(graphed, eager, atol=1e-6), (graphed - eager).abs().max()
    finally:
        group.close()
