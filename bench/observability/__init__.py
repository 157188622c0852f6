"""Benchmarks of what observability costs the server (tracing: docs/tracing.md)."""
