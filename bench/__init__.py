"""Benchmarks: modules that print a table last and write JSON (default bench/out/), run from the
repository root as `.venv/bin/python -m bench.<group>.<name>`; bench/README.md lists them."""
