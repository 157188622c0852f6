"""The bodies of the routers' worker API (docs/worker-api.md): what sglang-router / smg and
vllm-router read of a worker to register it (/server_info, /model_info) and to weigh it (/get_load),
in the shapes their sources parse (SGLang's own endpoints' shapes)."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from rillet.http.engine_api import EngineLike, StatsLike, WorkerEngine

# Hugging Face's class for each model_type rillet serves (config.json's `architectures`)
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration",
    "phi3": "Phi3ForCausalLM",
    "bert": "BertModel",
}


def version() -> str:
    try:
        return importlib.metadata.version("rillet")
    except importlib.metadata.PackageNotFoundError:  # run from a tree that is not installed
        return "unknown"


def server_info(engine: EngineLike, facts: WorkerEngine, stats: StatsLike) -> dict[str, Any]:
    """SGLang's /server_info names: smg 0.3 (sglang-router 0.3.x) registers the worker under
    `served_model_name` (else `model_path`); DP-aware routing reads `dp_size`. No `model_id` or
    `model` key: the router's parser takes them as one field, and both at once fail its parse.
    The limits are the engine's config (the server's may differ only in tests)."""
    cfg = engine.cfg
    return {
        "served_model_name": engine.model_name,
        "model_path": facts.model_path,
        "tokenizer_path": facts.model_path,
        "version": version(),
        "dp_size": 1,
        "tp_size": cfg.parallel.tensor_parallel_size,
        "max_total_tokens": stats.kv_tokens_total,
        "max_total_num_tokens": stats.kv_tokens_total,  # the name SGLang's own server uses
        "max_running_requests": cfg.scheduler.max_num_seqs,
        "max_prefill_tokens": cfg.scheduler.max_num_batched_tokens,
        "max_queued_requests": cfg.scheduler.max_waiting,
        "context_length": engine.max_model_len,
        "max_model_len": engine.max_model_len,
        "page_size": cfg.cache.block_size,
        "disable_radix_cache": not cfg.cache.prefix_caching,
        "is_embedding": "generate" not in engine.tasks,
    }


def model_info(engine: EngineLike, facts: WorkerEngine) -> dict[str, Any]:
    """SGLang's /model_info: smg reads `model_type` and `architectures` into the worker's labels."""
    arch = _ARCHITECTURES.get(facts.model_type)
    return {
        "model_path": facts.model_path,
        "tokenizer_path": facts.model_path,
        "served_model_name": engine.model_name,
        "is_generation": "generate" in engine.tasks,
        "model_type": facts.model_type,
        "architectures": [arch] if arch else [],
        "max_model_len": engine.max_model_len,
    }


def load(stats: StatsLike, block_size: int) -> list[dict[str, int]]:
    """SGLang's /get_load: one entry per data-parallel rank (rillet has one). smg sums `num_tokens`
    over the entries: the KV tokens in use (whole blocks: a block is taken whole). vllm-router
    reads a `load` key off an object instead, a shape no current engine serves (see the docs)."""
    return [
        {
            "dp_rank": 0,
            "num_reqs": stats.running + stats.waiting,
            "num_waiting_reqs": stats.waiting,
            "num_tokens": stats.kv_blocks_used * block_size,
        }
    ]
