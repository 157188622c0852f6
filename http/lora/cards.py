"""The /v1/models cards of the loaded LoRA adapters: `parent` is the base model, `root` the
adapter's folder (as vLLM lists them)."""

from __future__ import annotations

from typing import Any

from rillet.http.engine_api import EngineLike
from rillet.http.state import ServerState


def adapter_cards(state: ServerState, engine: EngineLike) -> list[dict[str, Any]]:
    """/v1/models entries of the loaded adapters (none for an engine without LoRA)."""
    infos = engine.lora_adapters() if hasattr(engine, "lora_adapters") else []  # type: ignore[attr-defined]
    return [
        {
            "id": a.name,
            "object": "model",
            "created": state.started,
            "owned_by": "rillet",
            "root": a.path,
            "parent": engine.model_name,
            "max_model_len": engine.max_model_len,
        }
        for a in infos
    ]
