"""vLLM's `--kv-events-config '{json}'`, as an llm-d deployment passes it to vLLM, taken as the
same `kv_events.*` keys (docs/kv-events.md), so the manifest's command line carries over."""

from __future__ import annotations

import json

from rillet.core.config import ConfigError

# vLLM's KVEventsConfig field -> rillet's kv_events key
_KEYS = {
    "enable_kv_cache_events": "enabled",
    "publisher": "publisher",
    "endpoint": "endpoint",
    "replay_endpoint": "replay_endpoint",
    "topic": "topic",
    "buffer_steps": "buffer_steps",
    "hwm": "hwm",
    "max_queue_size": "max_queue_size",
}


def kv_events_overrides(text: str) -> list[str]:
    """`--set`-style overrides for one --kv-events-config value; ConfigError naming the key."""
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        raise ConfigError("kv_events", "--kv-events-config: expected a JSON object (vLLM's KVEventsConfig)")
    out: list[str] = []
    for name, value in obj.items():
        key = _KEYS.get(name)
        if key is None:
            raise ConfigError(
                f"kv_events.{name}", f"--kv-events-config: not a field rillet takes ({', '.join(_KEYS)})"
            )
        if name == "publisher" and value == "null":  # vLLM's NullEventPublisher: no events
            out.append("kv_events.enabled=false")
            continue
        out.append(f"kv_events.{key}={json.dumps(value)}")
    return out
