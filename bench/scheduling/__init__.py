"""Benchmarks of scheduling policies through the server (request priority: docs/priority.md)."""
