"""Other servers' request forms on the OpenAI endpoints: vLLM's structured outputs, served through
the same grammar engine (guided.py), and the fields of vLLM and llama.cpp this server does not
serve, refused by name (refused.py)."""
