"""The server-wide side of connection handling: the cap on open connections, what the server does
past it, the counters in /metrics, and the log of closed slow connections.

The cap keeps client sockets from using up the process's file descriptors: past the soft limit,
accept() fails with EMFILE and asyncio stops accepting for a second at a time, for everyone, real
clients included. So the effective cap is `server.max_connections` bounded by what the descriptor
limit leaves once the descriptors already open (model files, pipes, threads) and a reserve are
counted. Past the cap, a new connection either gets a 503 at once (up to `_reply_budget` of them
open at a time, each closed when its client closes it or `REJECT_LIFETIME_S` later at most), or is
reset at once (`server.over_capacity`; past the 503 budget too).

The per-connection deadlines themselves live in connection.py; this counts and logs what they close.
"""

from __future__ import annotations

import enum
import logging
import os
import resource
import time

from prometheus_client import CollectorRegistry, Counter, Gauge
from rillet.core.config import ServerConfig

log = logging.getLogger("rillet.connections")

# A closed slow connection is logged at most once per client address per interval (a slowloris
# attack is thousands of closes a minute from a handful of addresses).
LOG_INTERVAL_S = 60.0
_MAX_PEERS_TRACKED = 10_000
# Descriptors kept for everything that is not a client socket: the executor's threads, files the
# engine opens later, the metrics scrape, log files.
_FD_RESERVE = 128
# A connection answered 503 (over the cap) is closed this long after the answer at most: time for
# the client to send its request and read the answer, not to become a slow connection of its own.
REJECT_LIFETIME_S = 1.0

DEADLINES = ("header", "body", "keepalive")


class Admission(enum.Enum):
    ADMIT = "admit"
    REPLY_503 = "reply_503"
    RESET = "reset"


def open_fds() -> int:
    """Descriptors this process holds now (Linux: /proc; elsewhere a guess)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # listdir's own descriptor
    except OSError:
        return 64


def soft_fd_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def effective_cap(max_connections: int, soft_limit: int, in_use: int) -> int:
    """`max_connections`, or less when the descriptors left would not hold it plus the 503 budget."""
    room = soft_limit - in_use - _FD_RESERVE
    # cap + reply budget (cap // 16) must fit in `room`
    return max(1, min(max_connections, room * 16 // 17))


class _PeerLog:
    """One line per client address per interval; the line says how many closes it stands for."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._seen: dict[str, tuple[float, int]] = {}  # address -> (last logged at, unlogged since)

    def note(self, peer: str, what: str) -> None:
        now = time.monotonic()
        last = self._seen.get(peer)
        if last is not None and now - last[0] < self.interval:
            self._seen[peer] = (last[0], last[1] + 1)
            return
        if len(self._seen) >= _MAX_PEERS_TRACKED:
            self._seen = {p: v for p, v in self._seen.items() if now - v[0] < self.interval}
        self._seen[peer] = (now, 0)
        more = f" (and {last[1]} more from this address not logged)" if last is not None and last[1] else ""
        log.warning("connection from %s closed: %s%s", peer, what, more)


class ConnLimits:
    def __init__(self, cfg: ServerConfig, registry: CollectorRegistry) -> None:
        self.header_timeout_s = cfg.header_timeout_s
        self.body_timeout_s = cfg.body_timeout_s
        self.keepalive_timeout_s = cfg.keepalive_timeout_s
        self.reject_lifetime_s = min(REJECT_LIFETIME_S, cfg.header_timeout_s)
        soft, in_use = soft_fd_limit(), open_fds()
        self.cap = effective_cap(cfg.max_connections, soft, in_use)
        if self.cap < cfg.max_connections:
            log.warning(
                "server.max_connections=%d does not fit the open files limit (%d, %d in use): "
                "capping connections at %d",
                cfg.max_connections,
                soft,
                in_use,
                self.cap,
            )
        self._reply_budget = 0 if cfg.over_capacity == "reset" else max(8, self.cap // 16)
        self.open = 0  # admitted connections
        self.replying = 0  # over-capacity connections being answered 503
        self._peers = _PeerLog(LOG_INTERVAL_S)
        r = registry
        timeouts = Counter(
            "rillet_connection_timeouts",
            "Connections closed for missing a read deadline (header, body) or idle too long (keepalive)",
            ["deadline"],
            registry=r,
        )
        self._timeouts = {d: timeouts.labels(d) for d in DEADLINES}
        rejected = Counter(
            "rillet_connections_rejected",
            "Connections over server.max_connections: answered 503 (reply_503) or reset",
            ["action"],
            registry=r,
        )
        self._rejected = {a: rejected.labels(a.value) for a in (Admission.REPLY_503, Admission.RESET)}
        self._accepted = Counter(
            "rillet_connections_accepted", "Connections accepted (cap allowing)", registry=r
        )
        Gauge("rillet_open_connections", "Client connections open", registry=r).set_function(
            lambda: self.open + self.replying
        )
        Gauge("rillet_max_connections", "The effective connection cap", registry=r).set(self.cap)

    # ---- admission -------------------------------------------------------------------------------
    def admit(self, peer: str) -> Admission:
        if self.open < self.cap:
            self.open += 1
            self._accepted.inc()
            return Admission.ADMIT
        verdict = Admission.REPLY_503 if self.replying < self._reply_budget else Admission.RESET
        if verdict is Admission.REPLY_503:
            self.replying += 1
        self._rejected[verdict].inc()
        what = "answered 503" if verdict is Admission.REPLY_503 else "reset"
        self._peers.note(peer, f"over the connection limit ({self.cap} open, server.max_connections): {what}")
        return verdict

    def release(self, admission: Admission) -> None:
        if admission is Admission.ADMIT:
            self.open -= 1
        elif admission is Admission.REPLY_503:
            self.replying -= 1

    # ---- deadlines -------------------------------------------------------------------------------
    def timed_out(self, deadline: str, peer: str) -> None:
        self._timeouts[deadline].inc()
        if deadline == "header":
            self._peers.note(
                peer,
                f"request headers not received within {self.header_timeout_s:g} s (server.header_timeout_s)",
            )
        elif deadline == "body":
            self._peers.note(
                peer, f"request body not received within {self.body_timeout_s:g} s (server.body_timeout_s)"
            )
        # keepalive: an idle connection closing is routine, counted but not logged
