"""Deterministic inference (engine.deterministic): batch- and split-invariant kernels on the CPU, so
that a request's logits depend only on its own tokens (not on its batch, chunking or prefix cache)."""
