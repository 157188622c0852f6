"""The Model Server Protocol's series, which the endpoint picker scores pods by (llm-d-router
docs/plugin-metric-protocol.md; vLLM's names, which rillet exports too), by the field of the
picker's engine config (core-metrics-extractor's engineConfigs) that names each."""

from __future__ import annotations

MODEL_SERVER_PROTOCOL = {
    "queuedRequestsSpec": "vllm:num_requests_waiting",  # gauge: requests waiting for a batch slot
    "runningRequestsSpec": "vllm:num_requests_running",  # gauge: requests in the running batch
    "kvUsageSpec": "vllm:kv_cache_usage_perc",  # gauge: fraction of KV blocks in use, 0..1
    "loraSpec": "vllm:lora_requests_info",  # labels max_lora, running/waiting_lora_adapters
    "cacheInfoSpec": "vllm:cache_config_info",  # labels block_size, num_gpu_blocks
}
