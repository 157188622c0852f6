"""The engine: its thread and inbox (engine.py), one step (core.py: schedule, launch; landing.py,
runs.py: land, detokenize, stop, publish), overlapped steps (overlap.py), continuous batching
(scheduler.py), the paged KV pool with prefix caching (block_manager.py), and text out of tokens
(detokenizer.py, stop_checker.py). Plain Python: no tensors and no CUDA here; the model is behind
runner/."""
