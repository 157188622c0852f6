"""LoRA adapters over HTTP: their /v1/models cards (cards.py) and vLLM's load / unload routes
(routes.py)."""
