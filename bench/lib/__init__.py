"""What the benchmarks share: paths, peak memory, JSON, tables, a server subprocess, a load generator."""
