"""Benchmarks of one kernel or op of a step, apart from the engine: the LM head by rows."""
