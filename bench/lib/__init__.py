"""What the benchmarks share: paths, peak memory, JSON, tables, a server subprocess, a load generator,
one request through the SDK or raw clients, and a timed batch of them with its CPU accounting."""
