"""Megatron-style sharding of a decoder over N ranks, and the checks it needs.

Column-parallel (output rows split): the fused q/k/v projection by attention heads, gate/up by
intermediate rows. Row-parallel (input columns split): o_proj by the same heads, down_proj by the
same intermediate rows; their outputs are partial sums, completed by an all-reduce. MoE experts
split the same way along their own intermediate dim (every rank holds a slice of every expert, so
routing needs no communication: the router is replicated, like the norms and the embedding).
The LM head lives on rank 0 only (the sampler is there). Specs name canonical tensors
(core/model/weights.py); `compose` turns one into an index of the file tensor holding it.

KV heads: with Hkv % N == 0 each rank holds Hkv / N of them; with N % Hkv == 0 each KV head is
replicated on N / Hkv consecutive ranks (as vLLM does), which are exactly the ranks holding its
query heads. Anything else is refused with a config error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rillet.core.config import ConfigError
from rillet.core.model.arch import ModelArch
from rillet.core.quant.int4 import GROUP

KEY = "parallel.tensor_parallel_size"

Rows = tuple[int, int]  # [start, stop) along a weight's dim 0 (rows) or dim 1 (columns)
Index = tuple[int | slice, ...]


@dataclass(frozen=True)
class ShardSpec:
    dim: int  # 0 = a slice of rows (column-parallel), 1 = a slice of columns (row-parallel)
    start: int
    stop: int


def compose(part: Index, ndim: int, spec: ShardSpec | None) -> Index:
    """The index into a file tensor of `ndim` dims of a canonical tensor's shard: `part` picks the
    canonical tensor (ints drop dims, slices keep them), `spec` slices its dim `spec.dim`."""
    index: list[int | slice] = [*part, *[slice(None)] * (ndim - len(part))]
    if spec is None:
        return tuple(index)
    kept = [i for i, x in enumerate(index) if isinstance(x, slice)]
    at = kept[spec.dim]
    cur = index[at]
    assert isinstance(cur, slice) and cur.step is None
    base = cur.start or 0
    index[at] = slice(base + spec.start, base + spec.stop)
    return tuple(index)


@dataclass(frozen=True)
class ShardPlan:
    arch: ModelArch  # the whole model's
    world_size: int
    rank: int

    @property
    def q_heads(self) -> int:  # query heads per rank
        return self.arch.num_heads // self.world_size

    @property
    def kv_heads(self) -> int:  # KV heads per rank (1 when replicated)
        return max(1, self.arch.num_kv_heads // self.world_size)

    @property
    def first_kv_head(self) -> int:
        a, n = self.arch, self.world_size
        if a.num_kv_heads >= n:
            return self.rank * self.kv_heads
        return self.rank * a.num_kv_heads // n  # replicated: N / Hkv ranks share one KV head

    @property
    def inter(self) -> int:
        return self.arch.intermediate_size // self.world_size

    @property
    def expert_inter(self) -> int:
        return self.arch.moe_intermediate_size // self.world_size

    @property
    def keeps_lm_head(self) -> bool:
        return self.rank == 0

    def local_arch(self) -> ModelArch:
        """The architecture of this rank's shard; ranks > 0 get no separate LM head (tied = none
        to load: they never compute logits)."""
        a = self.arch
        return dataclasses.replace(
            a,
            num_heads=self.q_heads,
            num_kv_heads=self.kv_heads,
            intermediate_size=self.inter,
            moe_intermediate_size=self.expert_inter,
            tie_word_embeddings=a.tie_word_embeddings or not self.keeps_lm_head,
        )

    def spec(self, hf_name: str) -> ShardSpec | None:
        """The slice of HF-named weight `hf_name` this rank holds; None = the whole tensor."""
        d = self.arch.head_dim
        q0 = self.rank * self.q_heads * d
        q = ShardSpec(0, q0, q0 + self.q_heads * d)
        kv0 = self.first_kv_head * d
        kv = ShardSpec(0, kv0, kv0 + self.kv_heads * d)
        inter = self.expert_inter if ".experts." in hf_name else self.inter
        i0 = self.rank * inter
        part = hf_name.rsplit(".", 2)
        proj = part[-2] if len(part) == 3 else ""
        if proj == "q_proj":
            return q
        if proj in ("k_proj", "v_proj"):
            return kv
        if proj == "o_proj":
            return ShardSpec(1, q.start, q.stop)
        if proj in ("gate_proj", "up_proj"):
            return ShardSpec(0, i0, i0 + inter)
        if proj == "down_proj":
            return ShardSpec(1, i0, i0 + inter)
        return None

    def wanted(self, hf_name: str) -> bool:
        return hf_name != "lm_head.weight" or self.keeps_lm_head


def check_shardable(arch: ModelArch, n: int, int4: bool = False) -> None:
    """Raises ConfigError (naming parallel.tensor_parallel_size and the sizes) if `arch` cannot be
    split over `n` ranks."""
    if n == 1:
        return
    hq, hkv, inter = arch.num_heads, arch.num_kv_heads, arch.intermediate_size
    heads = f"the model has {hq} query heads and {hkv} KV heads"
    if hq % n:
        raise ConfigError(KEY, f"{n} does not divide the query heads: {heads}; use a divisor of {hq}")
    if hkv % n and n % hkv:
        raise ConfigError(
            KEY,
            f"{n} neither divides nor is a multiple of the KV heads: {heads}; use a divisor of {hkv} "
            f"or a multiple of it that divides {hq}",
        )
    sizes = [("query heads x head_dim", hq * arch.head_dim)]
    if arch.num_experts == 0 or arch.dense_layers:
        sizes.append(("intermediate size", inter))
    if arch.num_experts:
        sizes.append(("experts' intermediate size", arch.moe_intermediate_size))
    for what, size in sizes[1:]:
        if size % n:
            raise ConfigError(KEY, f"{n} does not divide the {what} {size}")
    if int4:
        # int4 groups run along a row-parallel shard's input dim: a shard must hold whole groups
        for what, size in sizes:
            if (size // n) % GROUP:
                raise ConfigError(
                    KEY,
                    f"with int4 weights each rank's share of the {what} ({size} / {n} = {size // n}) "
                    f"must be a multiple of {GROUP}; use model.quantization=none or another size",
                )
