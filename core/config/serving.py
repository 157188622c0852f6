"""`stream`, `server`, `parallel`, `logging`: the front end, the processes, and their logs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rillet.core.config.errors import check

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
OverCapacity = Literal["reply_503", "reset"]


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
    # When the event loop's socket writes of a routing pass go out: as each stream's event is
    # formatted, before the ring's release (an engine that hands off waits meanwhile), or held until
    # after the release. after_release starts the engine's next model run one pass's sends
    # earlier; on a core the loop shares with a CPU model it streamed slightly worse at c = 8
    # (streamed / non-streamed, median of runs 0.980 against 0.986; bench/RESULTS.md 2026-12-05).
    write_order: Literal["as_formatted", "after_release"] = "as_formatted"
    # With asynchronous launches (CUDA) the event loop gives way to the engine thread's host work
    # (landing, scheduling and launching steps) instead of sharing the GIL with it, parking at most
    # engine_first_max_park_ms at a time; the probe says how the loop sees a step about to end
    # (core/engine/handoff/gil_gate.py). Off by default until measured to pay (bench/RESULTS.md).
    engine_first: Literal["on", "off"] = "off"
    engine_first_probe: Literal["device", "clock", "none"] = "none"
    engine_first_max_park_ms: float = 5.0
    # Anthropic Messages streams: a `ping` event after this many seconds without output (a long
    # prompt waiting or prefilling), so proxies and clients see the stream alive. 0 = none.
    ping_interval_s: float = 10.0

    def __post_init__(self) -> None:
        check(self.ping_interval_s >= 0, "stream.ping_interval_s", "must be >= 0")
        check(self.handoff_timeout_ms > 0, "stream.handoff_timeout_ms", "must be > 0")
        check(self.engine_first_max_park_ms > 0, "stream.engine_first_max_park_ms", "must be > 0")
        check(self.max_tokens_per_event >= 1, "stream.max_tokens_per_event", "must be >= 1")
        check(self.max_delay_ms >= 0, "stream.max_delay_ms", "must be >= 0")
        cap = self.ring_capacity
        check(
            2 <= cap <= 1 << 20 and cap & (cap - 1) == 0,
            "stream.ring_capacity",
            "must be a power of two in [2, 1048576]",
        )
        check(self.max_buffered_tokens >= 1, "stream.max_buffered_tokens", "must be >= 1")


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()  # empty = no auth
    max_body_bytes: int = 4 * 1024 * 1024
    max_header_bytes: int = 16 * 1024
    max_tokens_cap: int = 8192  # largest max_tokens a request may ask for
    default_max_tokens: int = 1024  # when a request names none (bounded by the context and the cap)
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
    # Origins whose web pages may call the API (http/net/cors.py): "*" or "http(s)://host[:port]"
    cors_allowed_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check(0 <= self.loop_nice <= 19, "server.loop_nice", "must be in 0..19")
        check(self.header_timeout_s > 0, "server.header_timeout_s", "must be > 0")
        check(self.body_timeout_s > 0, "server.body_timeout_s", "must be > 0")
        check(self.keepalive_timeout_s > 0, "server.keepalive_timeout_s", "must be > 0")
        check(self.max_connections >= 1, "server.max_connections", "must be >= 1")
        check(0 <= self.port <= 65535, "server.port", "must be in 0..65535")
        check(bool(self.host.strip()), "server.host", "must be an address (0.0.0.0: every interface)")
        check(self.max_body_bytes >= 1024, "server.max_body_bytes", "must be >= 1024")
        check(self.max_header_bytes >= 1024, "server.max_header_bytes", "must be >= 1024")
        check(self.max_tokens_cap >= 1, "server.max_tokens_cap", "must be >= 1")
        check(self.default_max_tokens >= 1, "server.default_max_tokens", "must be >= 1")
        check(self.max_n >= 1, "server.max_n", "must be >= 1")
        check(
            self.request_timeout_s is None or self.request_timeout_s > 0,
            "server.request_timeout_s",
            "must be > 0 or null",
        )
        check(self.drain_timeout_s >= 0, "server.drain_timeout_s", "must be >= 0")
        check(all(k for k in self.api_keys), "server.api_keys", "keys must be non-empty strings")
        check(
            all(_is_origin(o) for o in self.cors_allowed_origins),
            "server.cors_allowed_origins",
            'each must be "*" or an origin such as "https://example.com:8080" (scheme, host, port; no path)',
        )


def _is_origin(value: object) -> bool:
    """ "*", or a web origin: scheme, host and port, no path."""
    if value == "*":
        return True
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        return False
    host = value.split("//", 1)[1].rstrip("/")
    return bool(host) and "/" not in host


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
        check(n >= 1, "parallel.tensor_parallel_size", "must be >= 1")
        check(0 <= self.master_port <= 65535, "parallel.master_port", "must be in 0..65535")
        check(self.nnodes >= 1, "parallel.nnodes", "must be >= 1")
        check(
            n % self.nnodes == 0,
            "parallel.nnodes",
            f"must divide parallel.tensor_parallel_size ({n}): every host runs the same number of ranks",
        )
        check(0 <= self.node_rank < self.nnodes, "parallel.node_rank", f"must be in 0..{self.nnodes - 1}")
        check(
            self.nnodes == 1 or self.master_port != 0,
            "parallel.master_port",
            "must be set (not 0) when parallel.nnodes > 1: the other hosts connect to it",
        )
        check(bool(self.master_addr), "parallel.master_addr", "must not be empty")
        check(self.timeout_s > 0, "parallel.timeout_s", "must be > 0")
        check(self.liveness_timeout_s > 0, "parallel.liveness_timeout_s", "must be > 0")
        check(self.init_timeout_s > 0, "parallel.init_timeout_s", "must be > 0")

    @property
    def ranks_per_node(self) -> int:
        return self.tensor_parallel_size // self.nnodes


@dataclass(frozen=True)
class LoggingConfig:
    level: LogLevel = "INFO"
