"""What the benchmarks share: paths, peak memory, JSON, tables, a server subprocess, a load generator,
one request through the SDK or raw clients, and a timed batch of them with its CPU accounting; and
the inputs and clients of single benchmarks where their folder is full (structured_tasks: the JSON
tasks of bench/engine/structured_quality.py; spec_prompts, spec_client: bench/serving/speculative.py's
prompt sets and requests)."""
