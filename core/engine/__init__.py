"""The engine: its thread and inbox (engine.py), one step (core.py: schedule, launch; landing.py,
runs.py: land, detokenize, stop, publish), overlapped steps (overlap.py), continuous batching
(scheduler.py), the paged KV pool with prefix caching (block_manager.py), and text out of tokens
(detokenizer.py, stop_checker.py); handoff/: what passes between the engine thread and the event
loop (when a step's output is published, the loop giving way on the GIL). Plain Python: no tensors
and no CUDA here; the model is behind runner/."""
