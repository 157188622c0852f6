"""Sharding without processes: the plan's slices and checks, the shard readers against whole
tensors sliced, the step wire format, the config keys."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from rillet.core.attention.base import AttentionMetadata
from rillet.core.config import ConfigError, config_from_dict
from rillet.core.distributed import step_io
from rillet.core.distributed.plan import ShardPlan, check_shardable
from rillet.core.distributed.shard_load import iter_gguf_shard, iter_safetensors_shard
from rillet.core.llm import LLM
from rillet.core.loaders.default_model import default_model_path
from rillet.core.loaders.gguf import arch_from_gguf, iter_gguf_weights
from rillet.core.loaders.gguf_file import read_gguf
from rillet.core.loaders.hf import find_hf_folder, iter_safetensors, load_hf_folder
from rillet.core.model.shapes import SHAPES
from rillet.core.model.weights import canonical_parts
from rillet.core.runner.step_inputs import StepInputs
from tiny_models.gguf_export import write_gguf
from tp_helpers import TINY_TP

KEY = "parallel.tensor_parallel_size"


def test_heads_that_do_not_split_are_a_config_error_naming_the_counts() -> None:
    smollm2 = SHAPES["smollm2-135m"]  # 9 query heads, 3 KV heads
    check_shardable(smollm2, 3)
    with pytest.raises(ConfigError, match=r"parallel.tensor_parallel_size.*9 query heads and 3 KV heads"):
        check_shardable(smollm2, 2)
    odd = dataclasses.replace(smollm2, num_heads=6, num_kv_heads=3)
    with pytest.raises(ConfigError, match=r"neither divides nor is a multiple of the KV heads"):
        check_shardable(odd, 2)
    with pytest.raises(ConfigError, match=r"int4 .* multiple of 32"):
        check_shardable(SHAPES["tiny"], 4, int4=True)  # 4 heads x 16 / 4 = 16 columns per rank
    check_shardable(SHAPES["tiny"], 4)


def test_replicated_kv_heads_follow_their_query_heads() -> None:
    arch = dataclasses.replace(SHAPES["llama-1b"], num_heads=8, num_kv_heads=2)
    d = arch.head_dim
    for rank in range(4):  # 4 ranks, 2 KV heads: each KV head on 2 ranks
        plan = ShardPlan(arch, 4, rank)
        assert plan.kv_heads == 1 and plan.first_kv_head == rank // 2
        q = plan.spec("model.layers.0.self_attn.q_proj.weight")
        assert q is not None and (q.start // d, q.stop // d) == (2 * rank, 2 * rank + 2)
        # query heads 2r, 2r+1 belong to KV head (2r) // 4 = r // 2
        assert all(h // 4 == plan.first_kv_head for h in range(q.start // d, q.stop // d))
    local = ShardPlan(arch, 4, 1).local_arch()
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (
        2,
        1,
        arch.intermediate_size // 4,
    )
    assert local.tie_word_embeddings and ShardPlan(arch, 4, 1).spec("model.norm.weight") is None


def _sliced(name: str, full: torch.Tensor, plan: ShardPlan) -> torch.Tensor:
    spec = plan.spec(name)
    if spec is None:
        return full
    return full[spec.start : spec.stop] if spec.dim == 0 else full[:, spec.start : spec.stop]


def test_gguf_shards_equal_the_whole_tensors_sliced() -> None:
    """Default model, TP=3: the row shards of the (rotary-permuted) q/k, the block-aligned column
    shards of o_proj/down_proj, equal to the whole converted tensors sliced (first two layers)."""
    gguf = read_gguf(default_model_path())
    arch = arch_from_gguf(gguf)
    whole = dict(itertools.islice(iter_gguf_weights(gguf, arch, torch.float32), 20))
    for rank in range(3):
        plan = ShardPlan(arch, 3, rank)
        for name, shard in itertools.islice(iter_gguf_shard(gguf, plan, torch.float32), 20):
            assert torch.equal(shard, _sliced(name, whole[name], plan)), (rank, name)


def test_safetensors_shards_equal_the_whole_tensors_sliced(tiny_hf_model: Any) -> None:
    folder, _ = tiny_hf_model("qwen2", **TINY_TP)  # q/k/v biases too
    arch, _ = load_hf_folder(folder)
    files = find_hf_folder(folder).weight_files
    whole = dict(iter_safetensors(files, torch.float32))
    for rank in range(2):
        plan = ShardPlan(arch, 2, rank)
        shards = dict(iter_safetensors_shard(files, plan, torch.float32))
        assert ("lm_head.weight" in shards) == (rank == 0)
        for name, shard in shards.items():
            assert torch.equal(shard, _sliced(name, whole[name], plan)), (rank, name)


def _canonical(weights: Iterator[tuple[str, torch.Tensor]], arch: Any) -> dict[str, torch.Tensor]:
    return {c: t[i] if i else t for n, t in weights for c, i in canonical_parts(n, tuple(t.shape), arch)}


@pytest.mark.parametrize(
    ("family", "overrides"),
    [("phi3", {"rope_scaling": None}), ("mixtral", {}), ("qwen3_moe", {})],
)
def test_fused_and_stacked_shards_equal_the_canonical_tensors_sliced(
    tiny_hf_model: Any, tmp_path: Path, family: str, overrides: dict[str, Any]
) -> None:
    """Phi-3's fused qkv / gate_up and the experts (per-expert in the folder, stacked [E, rows,
    cols] in a Q8_0 GGUF, whose 16-column expert shards are not block-aligned) read per rank."""
    folder, _ = tiny_hf_model(family, **TINY_TP, **overrides)
    arch, weights = load_hf_folder(folder)
    files = find_hf_folder(folder).weight_files
    gguf = read_gguf(write_gguf(folder, family, tmp_path / "m.gguf", quant="Q8_0"))
    gguf_arch = arch_from_gguf(gguf)
    sources = [
        (_canonical(weights, arch), lambda plan: iter_safetensors_shard(files, plan, torch.float32), arch),
        (
            _canonical(iter_gguf_weights(gguf, gguf_arch, torch.float32), gguf_arch),
            lambda plan: iter_gguf_shard(gguf, plan, torch.float32),
            gguf_arch,
        ),
    ]
    for whole, shards, a in sources:
        for rank in range(2):
            plan = ShardPlan(a, 2, rank)
            got = dict(shards(plan))
            assert got.keys() == {n for n in whole if plan.wanted(n)}
            for name, shard in got.items():
                assert torch.equal(shard, _sliced(name, whole[name], plan)), (family, rank, name)


def test_step_inputs_round_trip() -> None:
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([8, 9, 10, 33], dtype=torch.int64),
        query_start=torch.tensor([0, 3, 4], dtype=torch.int32),
        seq_lens=torch.tensor([3, 18], dtype=torch.int32),
        block_tables=torch.tensor([[1, 0, 0], [2, 3, 4]], dtype=torch.int32),
        query_lens_cpu=[3, 1],
        seq_lens_cpu=[3, 18],
        block_size=8,
        num_prefills=1,
    )
    rows = torch.tensor([2, 3])
    inp = StepInputs(torch.tensor([5, 6, 7, 8]), torch.tensor([0, 1, 2, 17]), meta, rows, [], rows)
    head = step_io.header(step_io.STEP, inp)
    payload = step_io.pack(inp)
    assert payload.shape[0] == step_io.payload_size(head)
    out = step_io.unpack(head, payload, payload, 8)
    assert torch.equal(out.input_ids, inp.input_ids) and torch.equal(out.positions, inp.positions)
    m = out.meta
    for field in ("slot_mapping", "query_start", "seq_lens", "block_tables"):
        got, want = getattr(m, field), getattr(meta, field)
        assert got.dtype == want.dtype and torch.equal(got, want), field
    assert (m.query_lens_cpu, m.seq_lens_cpu, m.num_prefills) == ([3, 1], [3, 18], 1)
    host = torch.tensor([0, 3, 4, 3, 18])  # the NCCL layout: host copies sent apart
    assert step_io.unpack(head, payload, host, 8).meta.query_lens_cpu == [3, 1]


@pytest.mark.parametrize(
    ("parallel", "key"),
    [
        ({"tensor_parallel_size": 0}, "parallel.tensor_parallel_size"),
        ({"tensor_parallel_size": 3, "nnodes": 2, "master_port": 29500}, "parallel.nnodes"),
        ({"tensor_parallel_size": 2, "nnodes": 2}, "parallel.master_port"),
        ({"tensor_parallel_size": 2, "nnodes": 2, "node_rank": 2, "master_port": 1}, "parallel.node_rank"),
        ({"liveness_timeout_s": 0}, "parallel.liveness_timeout_s"),
        ({"backend": "mpi"}, "parallel.backend"),
    ],
)
def test_bad_parallel_config_names_the_key(parallel: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"parallel": parallel})
    assert err.value.key == key


def test_unsplittable_model_fails_before_any_process_starts(tiny_hf_model: Any) -> None:
    folder, _ = tiny_hf_model("llama", **TINY_TP)
    cfg = config_from_dict(
        {"model": {"path": str(folder), "kind": "hf"}, "parallel": {"tensor_parallel_size": 3}}
    )
    with pytest.raises(ConfigError, match=r"8 query heads and 4 KV heads") as err:
        LLM(cfg)
    assert err.value.key == KEY


def test_nccl_on_cpu_is_a_config_error(tiny_hf_model: Any) -> None:
    folder, _ = tiny_hf_model("llama", **TINY_TP)
    cfg = config_from_dict(
        {
            "model": {"path": str(folder), "kind": "hf", "device": "cpu"},
            "parallel": {"tensor_parallel_size": 2, "backend": "nccl"},
        }
    )
    with pytest.raises(ConfigError, match="nccl needs CUDA") as err:
        LLM(cfg)
    assert err.value.key == "parallel.backend"
