"""Prometheus metrics of one server: the registry and scrape-time engine numbers (registry.py),
and loop-owned lock-free histograms (loop_histogram.py)."""
