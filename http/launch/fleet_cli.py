"""`rillet fleet`'s arguments into a FleetPlan, checked before any process starts: a bad router,
policy, replica count, port or model path is one line naming the flag or key (exit 2)."""

from __future__ import annotations

import argparse
import os
import sys

from rillet.core.config import ConfigError, RilletConfig
from rillet.http.launch.fleet import FleetPlan, run_fleet
from rillet.http.launch.model_path import check_model_path
from rillet.http.launch.routers import FlagError, check_router

EXIT_USAGE = 2


def fleet_plan(args: argparse.Namespace, cfg: RilletConfig, overrides: list[str]) -> FleetPlan:
    if args.replicas < 1:
        raise FlagError("--replicas", f"must be >= 1, got {args.replicas}")
    if cfg.server.port == 0 or cfg.server.port + args.replicas + 1 > 65535:
        raise ConfigError(
            "server.port",
            f"{cfg.server.port}: the fleet takes ports P .. P + replicas + 1 (router, replicas, metrics)",
        )
    check_router(args.router, args.policy)
    check_model_path(cfg)
    serve_args = ["--config", args.config] if args.config else []
    for o in overrides:
        serve_args += ["--set", o]
    if cfg.model.num_threads is None:  # N replicas at torch's default each would oversubscribe the cores
        threads = max(1, (os.cpu_count() or 1) // args.replicas)
        serve_args += ["--set", f"model.num_threads={threads}"]
    return FleetPlan(
        replicas=args.replicas,
        host=cfg.server.host,
        port=cfg.server.port,
        serve_args=tuple(serve_args),
        router=args.router,
        policy=args.policy,
        router_args=tuple(args.router_args),
    )


def fleet_main(args: argparse.Namespace, cfg: RilletConfig, overrides: list[str]) -> int:
    try:
        plan = fleet_plan(args, cfg, overrides)
    except (ConfigError, FlagError) as exc:
        sys.stderr.write(f"rillet: error: {exc}\n")
        return EXIT_USAGE

    def say(line: str) -> None:  # where to connect is the command's output
        sys.stdout.write(f"rillet fleet: {line}\n")
        sys.stdout.flush()

    return run_fleet(plan, say)
