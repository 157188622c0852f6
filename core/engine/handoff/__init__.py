"""Between the engine thread and the event loop: when a step's output reaches the ring
(publisher.py), and the loop giving way to the engine's host work on the GIL (gil_gate.py)."""
