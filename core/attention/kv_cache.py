"""The paged KV cache: its storage dtype, its scales, and the two ops that touch its values.

The cache owns how K/V are stored (`cache.dtype`): the write ops quantize (`encode`), the
attention backends dequantize where they read (`gather`, `gather_blocks`); nothing above the
cache (model, runner, scheduler, block manager) knows the dtype.

  auto                          the model's dtype (float32 on CPU, bfloat16 on CUDA)
  float32 | bfloat16 | float16  the values, cast
  int8      each head's D values rotated by an orthonormal Hadamard transform (`rotate`), then
            symmetric codes with one float32 scale per token per KV head: scale = max|x| / 127,
            code = round(x / scale), so the largest is +-127 and an all-zero row stays zero.
            Per token, never per block: a token's stored values do not depend on what else
            shares its block or step (prefix caching, preemption and the deterministic backend
            need exactly that).
  fp8_e4m3  CUDA only (flashinfer's fp8 KV): the values clamped to +-448 and cast, scale 1.

Why the rotation: a few channels of K (and V) are far larger than the rest, so one absmax scale
left the others a handful of levels: on the default model (int4 weights) the mean logit error
against float32 went from 0.094 to 0.157 (transformers in bf16: 0.109). Spread over all D
channels by the rotation, 0.104, at the same bytes. Attention is invariant under it when the
query is rotated too (q.k = Rq.Rk, and the output sum p.Rv = R(sum p.v)), so an int8 backend
rotates q before and the output after (`rotate` is its own inverse) and never un-rotates the
context. It is a fast Walsh-Hadamard transform: additions and one scale, elementwise per row (no
matmul whose bits could depend on the batch), over the largest power-of-two block of D.

Layout, per layer a KVCache: k, v [num_blocks, block_size, Hkv, D] in the storage dtype;
scales = (k_scale, v_scale) [num_blocks, block_size, Hkv] float32 for int8, else None.

Every attention reads K/V as the cache holds them, the tokens of a fresh prompt too (`stored`):
a prompt computed whole, one continued after a prefix-cache hit and one recomputed after
preemption attend over the same values.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from rillet.core.config import ConfigError
from rillet.core.model.arch import ModelArch

KV_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int8": torch.int8,
    "fp8_e4m3": torch.float8_e4m3fn,
}
QMAX = 127.0  # int8 codes lie in [-127, 127]: symmetric, -128 unused
MIN_SCALE = 1e-12  # a row of zeros gets this scale (its codes are 0), never a division by 0
SCALE_DTYPE = torch.float32

Scales = tuple[torch.Tensor, torch.Tensor]  # k_scale, v_scale: [num_blocks, block_size, Hkv]


class KVCache(NamedTuple):
    """One layer's pool. Indexing [0] / [1] gives k / v, as the plain pair it replaced did."""

    k: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    scales: Scales | None = None  # int8 only


def resolve_kv_dtype(name: str, model_dtype: torch.dtype, device: torch.device | str) -> torch.dtype:
    """cache.dtype -> the pool's storage dtype; a ConfigError naming the key where it cannot run."""
    if name == "auto":
        return model_dtype
    if name not in KV_DTYPES:
        raise ConfigError("cache.dtype", f"unknown KV dtype {name!r}")
    if name == "fp8_e4m3" and torch.device(device).type != "cuda":
        raise ConfigError(
            "cache.dtype",
            "fp8_e4m3 needs CUDA (flashinfer's fp8 KV kernels); on CPU use int8 "
            "(about as small: a float32 scale per token and head beside the codes)",
        )
    return KV_DTYPES[name]


def kv_dtype_name(dtype: torch.dtype) -> str:
    return next((n for n, d in KV_DTYPES.items() if d == dtype), str(dtype).removeprefix("torch."))


def bytes_per_token(arch: ModelArch, dtype: torch.dtype) -> int:
    """Pool bytes one token takes over every layer, K and V, scales included."""
    per_head = arch.head_dim * dtype.itemsize + (SCALE_DTYPE.itemsize if dtype == torch.int8 else 0)
    return 2 * arch.num_layers * arch.num_kv_heads * per_head


def allocate_kv_cache(
    arch: ModelArch, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str
) -> list[KVCache]:
    """Per layer a KVCache of separate zeroed tensors (sliding and global layers alike: a sliding
    layer masks what lies outside its window). `dtype`: the storage dtype (resolve_kv_dtype).

    Separate, not views of one pool: the compiled decode step writes the cache in place, and
    torch.compile turns a write into inputs that alias each other into a copy of their whole
    storage (the full pool, every step); distinct tensors are updated in place.
    Zeroed, not empty: masked-out slots are still multiplied by a zero weight, and a NaN bit
    pattern left in never-written memory would turn that into NaN (a zero scale dequantizes to 0).
    """
    shape = (num_blocks, block_size, arch.num_kv_heads, arch.head_dim)

    def zeros(s: tuple[int, ...], dt: torch.dtype) -> torch.Tensor:
        return torch.zeros(s, dtype=dt, device=device)

    def scales() -> Scales | None:
        return (zeros(shape[:3], SCALE_DTYPE), zeros(shape[:3], SCALE_DTYPE)) if dtype == torch.int8 else None

    return [KVCache(zeros(shape, dtype), zeros(shape, dtype), scales()) for _ in range(arch.num_layers)]


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] times the orthonormal Hadamard matrix (block-diagonal over the largest power of
    two dividing D): an int8 pool's space. Symmetric and orthonormal, so its own inverse.

    Two forms of the one map, equal up to float rounding. Eager: the butterfly (no temporary
    larger than x; a long prefill rotates thousands of rows). Traced (the compiled decode and
    verify steps): one reduction against the matrix as a constant, which Inductor emits as a
    single vectorised loop nest, where the butterfly's six stacks became six nests over a 3- or
    9-wide axis and cost the batch-1 step ~45 us a layer for its four rotations."""
    d = x.shape[-1]
    g = d & -d  # the largest power of two dividing d
    if torch.compiler.is_compiling():
        mat = torch.tensor(_hadamard(g), dtype=x.dtype, device=x.device)  # [g, g], a graph constant
        return (x.reshape(*x.shape[:-1], d // g, 1, g) * mat).sum(-1).reshape(x.shape)
    y = x
    h = 1
    while h < g:  # butterfly stage: pairs h apart within blocks of 2h -> (a + b, a - b)
        y = y.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        y = torch.stack((y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]), dim=-2)
        h *= 2
    return y.reshape(x.shape) * g**-0.5


@functools.lru_cache(maxsize=8)
def _hadamard(g: int) -> tuple[tuple[float, ...], ...]:
    """The orthonormal g x g Hadamard matrix (Sylvester's order, the butterfly's): entry (i, j) is
    (-1)^popcount(i & j) / sqrt(g). Cached: a pure function of g, built once per head size."""
    row = range(g)
    return tuple(tuple((-1.0 if (i & j).bit_count() % 2 else 1.0) * g**-0.5 for j in row) for i in row)


def rotated(scales: Scales | None) -> bool:
    """Whether a pool with these scales (int8) holds K/V rotated: the query and output then are too."""
    return scales is not None


def encode(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [..., D] -> (its values in the storage dtype, int8: their scales [...] float32; the codes
    hold rotate(x))."""
    if dtype == torch.int8:
        xf = rotate(x.float())
        scale = (xf.abs().amax(dim=-1) / QMAX).clamp(min=MIN_SCALE)
        codes = torch.round(xf / scale[..., None]).clamp(-QMAX, QMAX).to(torch.int8)
        return codes, scale
    if dtype.is_floating_point and dtype.itemsize == 1:  # fp8: a cast past +-max would be NaN
        fmax = torch.finfo(dtype).max
        return x.clamp(-fmax, fmax).to(dtype), None
    return x.to(dtype), None


def decode(values: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """`encode` undone into `dtype` up to the rotation: values [..., D], scale [...] or None. An int8
    pool's values stay rotated (what its attention reads, with a rotated query)."""
    if scale is None:
        return values.to(dtype)
    return (values.float() * scale[..., None]).to(dtype)


def stored(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x as a cache of `dtype` gives it back to the attention, in x's dtype (x itself when nothing
    is lost; int8: rotated, as `decode`)."""
    if x.dtype == dtype:
        return x
    values, scale = encode(x, dtype)
    return decode(values, scale, x.dtype)


def write_rows(
    x: torch.Tensor,  # [T, Hkv, D]
    cache: torch.Tensor,  # [N, bs, Hkv, D]
    scale: torch.Tensor | None,  # [N, bs, Hkv]
    slots: torch.Tensor,  # [T] int64, every entry a valid flat slot
    *,
    index_put: bool = False,
) -> None:
    """Stores x at `slots`, quantized as the cache is. `index_put`: as cache[slots] = x, the form the
    graph-safe paths use (the compiled step updates it in place); else one index_copy_ (eager)."""
    values, s = encode(x, cache.dtype)
    targets = [(cache.view(-1, *cache.shape[2:]), values)]
    if scale is not None:
        assert s is not None
        targets.append((scale.view(-1, scale.shape[2]), s))
    for flat, new in targets:
        if index_put:
            flat[slots] = new
        else:
            flat.index_copy_(0, slots, new)


def gather(
    cache: torch.Tensor,  # [N, bs, Hkv, D]
    scale: torch.Tensor | None,  # [N, bs, Hkv]
    table: torch.Tensor,  # [X, W] block ids
    dtype: torch.dtype,
) -> torch.Tensor:  # [X, W * bs, Hkv, D] in dtype
    """The blocks of each row's table, dequantized. index_select, not cache[table]: advanced
    indexing is ~100x slower on CPU here."""
    x, w = table.shape
    bs, hkv, d = cache.shape[1:]
    flat = table.reshape(-1)
    values = cache.index_select(0, flat).view(x, w * bs, hkv, d)
    s = None if scale is None else scale.index_select(0, flat).view(x, w * bs, hkv)
    return decode(values, s, dtype)


def gather_blocks(
    cache: torch.Tensor,  # [N, bs, Hkv, D]
    scale: torch.Tensor | None,
    table: torch.Tensor,  # [X, W]
) -> torch.Tensor:  # [X, W, bs, Hkv, D] float32
    """As `gather`, keeping the width and block axes apart and in float32: the compiled decode and
    verify reductions (Inductor fuses the gather and the dequantization into them)."""
    x, w = table.shape
    bs, hkv, d = cache.shape[1:]
    flat = table.reshape(-1)
    values = cache.index_select(0, flat).view(x, w, bs, hkv, d).float()
    if scale is None:
        return values
    return values * scale.index_select(0, flat).view(x, w, bs, hkv, 1)


def describe_pool(arch: ModelArch, usable_blocks: int, block_size: int, dtype: torch.dtype) -> str:
    """The start-up summary of a pool: blocks, the tokens they hold, the storage and its bytes."""
    tokens = usable_blocks * block_size
    mib = (usable_blocks + 1) * block_size * bytes_per_token(arch, dtype) / 2**20  # + the dummy block
    return (
        f"KV pool {usable_blocks} blocks x {block_size} tokens = {tokens} tokens "
        f"({kv_dtype_name(dtype)}, {mib:.0f} MiB)"
    )
