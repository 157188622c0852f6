"""Benchmarks of the engine offline: throughput, compile time, numerics, tensor parallelism."""
