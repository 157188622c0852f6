"""Attention backends behind one interface (base.py): the torch backend (CPU, and the reference),
graph-safe paged decode (paged_decode.py), flashinfer on CUDA, and their selection (select.py)."""
