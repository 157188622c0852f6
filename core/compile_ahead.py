"""`rillet compile`: build and save a config's compiled steps ahead of time, then exit.

For container images and deploys: compile once at build time, then every `rillet serve` with the
same config, weights, torch and CPU cap loads the saved steps at start-up and compiles nothing
(graphs/aot/). The model is loaded as the server loads it; the KV pool is a small one, since a
saved step takes the pool's block count as an input. Also the child process the server starts
for a missing step (core/compile_process.py): `python -m rillet.core.compile_ahead --child`,
the config as JSON on standard input.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rillet.core.config import RilletConfig, config_from_dict
from rillet.core.distributed.parent_death import die_with_parent

if TYPE_CHECKING:  # torch loads only once the child has lowered its priority (main)
    import torch
    from rillet.core.build import ModelSource, Precision

log = logging.getLogger(__name__)

EXIT_PARENT_GONE = 3  # the child's exit code when the server was gone before it started
EXAMPLE_BLOCKS = 4  # the build's KV pool: a saved step serves every pool size
Say = Callable[[str], None]


def compile_artifacts(cfg: RilletConfig, say: Say, steps: Sequence[str] | None = None) -> list[str]:
    """Builds the saved steps `rillet serve` with `cfg` would load (those named in `steps`, when
    given); returns those built (each already saved is kept and not built again). `say`: a
    progress line (a step started, built)."""
    from rillet.core.attention.kv_cache import allocate_kv_cache, resolve_kv_dtype
    from rillet.core.build import load_model, max_blocks_per_seq, resolve_device, set_threads
    from rillet.core.graph_setup import graph_runner

    device = resolve_device(cfg.model.device)
    set_threads(cfg.model.num_threads)
    why_not = _nothing_to_save(cfg, device)
    if why_not is not None:
        say(f"nothing to compile ahead: {why_not}")
        return []
    src, precision = _source(cfg, device)
    say(f"loading the model ({src.kind}: {src.path or cfg.model.shape})")
    model = load_model(cfg, src, device, precision, lambda stage, frac: None)
    kv_dtype = resolve_kv_dtype(cfg.cache.dtype, precision.dtype, device)
    kv = allocate_kv_cache(model.arch, EXAMPLE_BLOCKS, cfg.cache.block_size, kv_dtype, device)
    graphs = graph_runner(cfg, model, kv, device, max_blocks_per_seq(cfg, model.arch), in_process=True)
    if graphs is None or graphs.compiled is None or graphs.compiled.plan is None:
        say(f"nothing to compile ahead: the decode step runs {graphs.mode if graphs else 'eager'} here")
        return []
    built = graphs.build_artifacts(say, steps)
    say(f"built {len(built)} compiled step(s)" if built else "every compiled step is saved already")
    return built


def _nothing_to_save(cfg: RilletConfig, device: torch.device) -> str | None:
    from rillet.core.determinism.mode import resolve_deterministic

    if device.type != "cpu":
        return "CUDA graphs are captured at start-up (artifacts are for the compiled CPU step)"
    if cfg.graphs.enabled == "off" or cfg.graphs.artifacts == "off":
        return "graphs.enabled or graphs.artifacts is off"
    if cfg.lora.enabled:
        return "with LoRA adapters the step is compiled at each start (it reads their buffers)"
    if resolve_deterministic(cfg, "cpu")[0]:
        return "engine.deterministic on serves the eager step only"
    if cfg.model.kind == "synthetic":
        return "the synthetic model has no decode step"
    return None


def _source(cfg: RilletConfig, device: torch.device) -> tuple[ModelSource, Precision]:
    from rillet.core.build import resolve_precision, resolve_source
    from rillet.core.config import ConfigError
    from rillet.core.embed_build import resolve_tasks

    src = resolve_source(cfg)
    setup = resolve_tasks(cfg, src)
    if setup.encoder or "generate" not in setup.tasks:
        raise ConfigError("model.task", "an embeddings-only model has no decode step to compile")
    return src, resolve_precision(cfg, src, device)


def main(argv: Sequence[str] | None = None) -> int:
    """The server's child process (core/compile_process.py)."""
    ap = argparse.ArgumentParser(prog="python -m rillet.core.compile_ahead")
    ap.add_argument("--child", action="store_true", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--nice", type=int, default=0)
    ap.add_argument("--parent", type=int, default=0, help="the server's pid: end with it (0: no check)")
    ap.add_argument("--steps", default="", help="comma-separated step names to build (default: all)")
    args = ap.parse_args(argv)
    if args.parent:  # a server killed (SIGKILL, a second signal) must not leave its compile running
        die_with_parent(args.parent, EXIT_PARENT_GONE)
    os.nice(args.nice)  # before torch starts a thread: everything the child runs inherits it
    cfg = config_from_dict(json.loads(sys.stdin.read()))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    import torch

    torch.set_num_threads(args.threads)

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    compile_artifacts(cfg, say, args.steps.split(",") if args.steps else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
