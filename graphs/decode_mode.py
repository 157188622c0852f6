"""Which decode path a device gets: CUDA graphs, the compiled CPU step, or eager
(`graphs.enabled` and `graphs.compile_mode` read together).

Apart from GraphRunner (graphs/runner.py): the start-up code (core/graph_setup.py) resolves and
logs the mode before, and whether or not, it builds a runner.
"""

from __future__ import annotations

from typing import Literal

import torch
from rillet.graphs.interface import GraphSettings

DecodeMode = Literal["cuda_graphs", "compiled", "eager"]


def resolve_decode_mode(settings: GraphSettings, device: torch.device) -> tuple[DecodeMode, str]:
    """graphs.enabled and graphs.compile_mode for a device -> (mode, why), for the start-up log.

    CUDA: auto/on = CUDA graphs. CPU: auto/on = the compiled step (auto keeps it only if it
    measures faster than eager at start-up), unless compile_mode is none (nothing to compile).
    """
    enabled = settings.enabled
    if enabled not in ("auto", "on", "off"):
        raise ValueError(f"config key 'graphs.enabled': expected 'auto', 'on' or 'off', got {enabled!r}")
    if enabled == "off":
        return "eager", "graphs.enabled is off"
    if device.type == "cuda":
        return "cuda_graphs", f"graphs.enabled {enabled} on CUDA"
    if settings.compile_mode == "none":
        if enabled == "on":
            raise ValueError(
                "config key 'graphs.enabled': 'on' on CPU means the torch.compile'd decode step, "
                "but graphs.compile_mode is 'none'; set a compile mode or use 'auto'/'off'"
            )
        return "eager", "graphs.compile_mode is none (nothing to compile on CPU)"
    if enabled == "on":
        return "compiled", "graphs.enabled on: compiled decode step on CPU (torch.compile)"
    return "compiled", "graphs.enabled auto on CPU: compiled decode step if it measures faster than eager"
