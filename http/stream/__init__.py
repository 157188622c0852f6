"""The streaming transport: the ring's consumer (dispatcher.py) routing deltas to per-request
streams (request_stream.py), coalescing, SSE writing straight to the socket (sse.py,
transport_write.py), and the non-streaming collector (collect.py)."""
