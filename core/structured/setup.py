"""Structured outputs for a loaded runtime: the grammar compiler and the runner's mask filler."""

from __future__ import annotations

import logging

from rillet.core.config import StructuredConfig
from rillet.core.runner.base import Runner
from rillet.core.runner.model_runner import ModelRunner
from rillet.core.structured.compiler import GrammarCompiler, grammar_engine_available
from rillet.core.structured.json_style import json_options
from rillet.core.structured.masks import MaskFiller
from rillet.core.structured.spec import INSTALL_HINT
from rillet.core.tokenizer.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def attach_structured(
    cfg: StructuredConfig, tokenizer: Tokenizer, runner: Runner, vocab_size: int | None
) -> tuple[GrammarCompiler | None, str]:
    """(compiler, "") when outputs can be constrained, else (None, why not)."""
    if not grammar_engine_available():
        log.info("structured outputs off: llguidance is not installed")
        return None, INSTALL_HINT
    runner = getattr(runner, "inner", runner)  # tensor parallelism wraps rank 0's ModelRunner
    if not isinstance(runner, ModelRunner) or vocab_size is None:
        return None, "structured outputs need a real model (not the synthetic one)"
    eos = tokenizer.eos_token_ids
    options = json_options(cfg.whitespace)
    compiler = GrammarCompiler(tokenizer.backend_json(), vocab_size, eos, cfg.cache_size, options)
    lazy = cfg.lazy_masks == "on" or (cfg.lazy_masks == "auto" and runner.device.type == "cpu")
    runner.masks = MaskFiller(vocab_size, eos, lazy=lazy)
    log.info("structured outputs: llguidance, lazy masks for greedy rows %s", "on" if lazy else "off")
    return compiler, ""
