"""Benchmarks of the serving stack: the HTTP server with the null engine or the real model."""
