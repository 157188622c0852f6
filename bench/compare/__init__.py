"""rillet side by side with other servers on the same machine and model (llama.cpp: bench/README.md)."""
