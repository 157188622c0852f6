"""The `rillet` command: `rillet serve ...`, `rillet worker ...` (another host's tensor-parallel
ranks), `rillet compile ...` (save the compiled CPU decode step ahead of time, core/compile_ahead.py)
and `rillet config --print ...`.

Every flag is a shorthand for a `--set section.key=value` override, applied after `--set`, so
there is one validation path (core/config.py) and one kind of error: a bad key or value exits
with status 2 and one line naming the key and what it accepts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence

import yaml
from rillet.core.config import ConfigError, RilletConfig, config_to_dict, load_config
from rillet.core.determinism.env import request_strict_mkl
from rillet.http.launch.kv_events_flag import kv_events_overrides

EXIT_USAGE = 2
# flag dest -> config key (values are passed as JSON, which YAML parses back unchanged; the
# standard library's, which writes any int: --port 99999999999999999999 is a range error, not a crash)
_FLAG_KEYS = {
    "model": "model.path",
    "host": "server.host",
    "port": "server.port",
    "dtype": "model.dtype",
    "log_level": "logging.level",
    # vLLM's names for the same keys, so its users' command lines carry over
    "served_model_name": "model.served_name",
    "max_model_len": "model.max_model_len",
    "tensor_parallel_size": "parallel.tensor_parallel_size",
    "scheduling_policy": "scheduler.policy",
}


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML config file (see rillet.yaml)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config key; the value is YAML (e.g. --set cache.block_size=32); repeatable",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rillet", description="OpenAI-compatible LLM inference server")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,fleet,worker,compile,config}")
    serve = sub.add_parser("serve", help="start the server")
    _add_config_args(serve)
    serve.add_argument("--model", metavar="PATH", help="model file or folder (= --set model.path=PATH)")
    serve.add_argument("--host", help="address to listen on (= --set server.host=H)")
    serve.add_argument("--port", type=int, help="port to listen on (= --set server.port=P)")
    serve.add_argument(
        "--api-key",
        dest="api_keys",
        action="append",
        metavar="KEY",
        help="require this Bearer key (repeatable)",
    )
    serve.add_argument("--dtype", help="float32 | bfloat16 | float16 | auto (= --set model.dtype=D)")
    serve.add_argument("--log-level", help="DEBUG | INFO | WARNING | ERROR (= --set logging.level=L)")
    serve.add_argument("--served-model-name", metavar="NAME", help="(= --set model.served_name=NAME)")
    serve.add_argument("--max-model-len", type=int, metavar="N", help="(= --set model.max_model_len=N)")
    serve.add_argument(
        "--tensor-parallel-size", type=int, metavar="N", help="(= --set parallel.tensor_parallel_size=N)"
    )
    serve.add_argument(
        "--scheduling-policy", metavar="P", help="fcfs | priority (= --set scheduler.policy=P)"
    )
    serve.add_argument(
        "--lora-modules",
        nargs="+",
        metavar="NAME=PATH",
        help="LoRA adapters served by name, as vLLM's flag: NAME=PATH or a JSON object with name and "
        "path (= --set lora.adapters={NAME: PATH, ...})",
    )
    serve.add_argument(
        "--kv-events-config",
        metavar="JSON",
        help="vLLM's KV-cache events config, e.g. an llm-d manifest's (= --set kv_events.KEY=... per field)",
    )
    _add_fleet_parser(sub)
    worker = sub.add_parser(
        "worker",
        help="run another host's tensor-parallel ranks (parallel.node_rank >= 1) for a `rillet serve`",
    )
    _add_config_args(worker)
    worker.add_argument("--log-level", help="DEBUG | INFO | WARNING | ERROR (= --set logging.level=L)")
    compile_ = sub.add_parser(
        "compile",
        help="build and save the compiled decode step (and verify step) of a config, then exit: "
        "`rillet serve` with the same config then loads them and compiles nothing",
    )
    _add_config_args(compile_)
    compile_.add_argument("--model", metavar="PATH", help="model file or folder (= --set model.path=PATH)")
    compile_.add_argument("--log-level", help="DEBUG | INFO | WARNING | ERROR (= --set logging.level=L)")
    config = sub.add_parser("config", help="show the effective configuration")
    _add_config_args(config)
    config.add_argument("--print", action="store_true", help="print the effective config as YAML (default)")
    return parser


def _add_fleet_parser(sub: argparse._SubParsersAction) -> None:
    fleet = sub.add_parser(
        "fleet",
        help="start N `rillet serve` replicas of one config behind a cache-aware router "
        "(sglang-router or vllm-router: pip install 'rillet[fleet]'); Ctrl-C stops them all",
    )
    _add_config_args(fleet)
    fleet.add_argument("--model", metavar="PATH", help="model file or folder (= --set model.path=PATH)")
    fleet.add_argument("--host", help="address the router and replicas listen on (= --set server.host=H)")
    fleet.add_argument(
        "--port", type=int, help="the router's port (= --set server.port=P); replica i on P + 1 + i"
    )
    fleet.add_argument("--log-level", help="DEBUG | INFO | WARNING | ERROR (= --set logging.level=L)")
    fleet.add_argument("--replicas", type=int, default=2, metavar="N", help="replicas to start (default 2)")
    fleet.add_argument("--router", default="sglang-router", help="sglang-router (default) | vllm-router")
    fleet.add_argument(
        "--policy", default="cache_aware", help="cache_aware (default) | round_robin | power_of_two | random"
    )
    fleet.add_argument(
        "--router-arg",
        dest="router_args",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for the router, verbatim (e.g. --router-arg=--balance-abs-threshold=4); "
        "repeatable",
    )


def overrides_from(args: argparse.Namespace) -> list[str]:
    out = list(args.overrides)
    for dest, key in _FLAG_KEYS.items():
        value = getattr(args, dest, None)
        if value is not None:
            if dest == "log_level":
                value = value.upper()
            out.append(f"{key}={json.dumps(value)}")
    if getattr(args, "api_keys", None):
        out.append(f"server.api_keys={json.dumps(args.api_keys)}")
    if getattr(args, "lora_modules", None):
        out.append(f"lora.adapters={json.dumps(dict(_lora_module(m) for m in args.lora_modules))}")
    if getattr(args, "kv_events_config", None):
        out += kv_events_overrides(args.kv_events_config)
    return out


def _lora_module(text: str) -> tuple[str, str]:
    """vLLM's --lora-modules forms: `name=path`, or `{"name": ..., "path": ...}`."""
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(obj.get("path"), str):
            return obj["name"], obj["path"]
    elif "=" in text:
        name, path = text.split("=", 1)
        return name, path
    raise ConfigError("lora.adapters", f"--lora-modules {text!r}: expected NAME=PATH or a JSON name and path")


def config_yaml(cfg: RilletConfig) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(args.config, overrides_from(args))
    except ConfigError as exc:
        sys.stderr.write(f"rillet: error: {exc}\n")
        return EXIT_USAGE
    if cfg.engine.deterministic == "on":  # before anything imports torch (MKL reads it once)
        request_strict_mkl()
    if args.command == "config":
        sys.stdout.write(config_yaml(cfg))
        return 0
    _setup_logging(cfg.logging.level)
    if args.command == "worker":
        return _worker(cfg)
    if args.command == "compile":
        return _compile(cfg)
    if args.command == "fleet":
        from rillet.http.launch.fleet_cli import fleet_main

        return fleet_main(args, cfg, overrides_from(args))
    from rillet.http.serve import StoppedWhileLoading, serve  # `rillet config` stays light

    try:
        return asyncio.run(serve(cfg))
    except StoppedWhileLoading:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except OSError as exc:  # e.g. the port is taken
        where = f"server.host={cfg.server.host!r}, server.port={cfg.server.port}"
        logging.getLogger("rillet.serve").error("cannot serve (%s): %s", where, exc)
        return 1


def _worker(cfg: RilletConfig) -> int:
    from rillet.core.distributed.node import run_node  # imports torch: only for this command

    try:
        return run_node(cfg)
    except ConfigError as exc:
        sys.stderr.write(f"rillet: error: {exc}\n")
        return EXIT_USAGE


def _compile(cfg: RilletConfig) -> int:
    from rillet.core.compile_ahead import compile_artifacts  # imports torch: only for this command

    def say(line: str) -> None:  # the progress lines are the command's output
        sys.stdout.write(f"rillet compile: {line}\n")
        sys.stdout.flush()

    from rillet.http.launch.model_path import check_model_path

    try:
        check_model_path(cfg)  # one line naming the key, as `rillet serve` gives
        compile_artifacts(cfg, say)
    except ConfigError as exc:
        sys.stderr.write(f"rillet: error: {exc}\n")
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
