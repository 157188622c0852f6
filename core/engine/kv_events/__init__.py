"""KV-cache events (kv_events.enabled): what the prefix cache stores and drops, published the way
vLLM publishes them, so llm-d's precise prefix-cache scorer can route to the replica that holds a
prompt's blocks (docs/kv-events.md).

hashing.py computes the published block hash (llm-d's own key for a block); recorder.py turns what
the block manager does into vLLM's event records; publisher.py sends each engine step's records
from a thread of its own over a ZMQ PUB socket; setup.py wires them to an engine."""
