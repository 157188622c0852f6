"""The HTTP tests' stand-ins for what lies under the server. The fake engine's parts (the engine
itself is tests/support/fake_engine.py, which re-exports them): its byte tokenizer
(byte_tokenizer.py) and its sequences, with the delta each emits per step (fake_sequences.py).
A vision model's front end and chat template (fake_vision.py). And for the SSE pump's tests, the
deltas an engine sends and the dispatcher routes (stream_deltas.py)."""
