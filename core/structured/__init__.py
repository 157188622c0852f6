"""Structured outputs: grammars (JSON Schema, JSON object, Lark) compiled by llguidance, one matcher
per constrained sequence, and the batched token bitmasks the sampler applies to their logits.

Only masks.py imports torch; the rest is importable by the HTTP layer's process without it.
"""
