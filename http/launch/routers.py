"""The routers `rillet fleet` puts in front of its replicas: sglang-router and vllm-router, both
Rust routers shipped as Python wheels (`pip install rillet[fleet]`), started as
`python -m <package>.launch_router` with the replicas' URLs.

Each keeps an approximate radix tree of the text it sent to every worker (cache_aware) and
health-checks the workers' /health; their flags are the same names, so one command line serves
both, the router's own flags passed through verbatim after it (--router-arg), overriding the
fleet's defaults.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass

# the name a user types -> the Python package whose launch_router module starts it
ROUTER_PACKAGES = {"sglang-router": "sglang_router", "vllm-router": "vllm_router"}
POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")
# cache_aware: balance by load once two replicas' in-flight requests differ by more than 2 (the
# routers' default, 64, suits GPU batches: with a long system prompt shared by every conversation,
# each new one matches the first replica's tree and the other idles; bench/fleet/routing.py)
BALANCE = ("--balance-abs-threshold", "2", "--balance-rel-threshold", "1.0")
# both log every worker-registration step at info; a --log-level in --router-arg comes later and wins
QUIET = {"sglang-router": "warn", "vllm-router": "warning"}


class FlagError(ValueError):
    """A bad `rillet fleet` flag; `flag` names it (exit 2, as a bad config key)."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


@dataclass(frozen=True)
class RouterPlan:
    """One router process: where it listens, what it routes to and how."""

    name: str
    host: str
    port: int
    metrics_port: int  # both routers bind a Prometheus port (29000 by default: two fleets collide)
    worker_urls: tuple[str, ...]
    policy: str
    extra_args: tuple[str, ...] = ()


def check_router(name: str, policy: str) -> None:
    """FlagError naming the flag when the router is unknown, not installed, or the policy is
    not one both routers have."""
    if name not in ROUTER_PACKAGES:
        raise FlagError("--router", f"{name!r} is not one of {', '.join(ROUTER_PACKAGES)}")
    if policy not in POLICIES:
        raise FlagError("--policy", f"{policy!r} is not one of {', '.join(POLICIES)}")
    if importlib.util.find_spec(ROUTER_PACKAGES[name]) is None:
        raise FlagError("--router", f"{name} is not installed: pip install 'rillet[fleet]'")


def router_command(plan: RouterPlan) -> list[str]:
    """The router's command line; this interpreter runs it, so the venv need not be on PATH."""
    return [
        sys.executable,
        "-m",
        f"{ROUTER_PACKAGES[plan.name]}.launch_router",
        "--host",
        plan.host,
        "--port",
        str(plan.port),
        "--prometheus-port",
        str(plan.metrics_port),
        "--policy",
        plan.policy,
        "--log-level",
        QUIET[plan.name],
        "--worker-urls",
        *plan.worker_urls,
        *(BALANCE if plan.policy == "cache_aware" else ()),
        *plan.extra_args,  # last: a flag given again wins
    ]
