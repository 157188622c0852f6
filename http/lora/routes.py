"""vLLM's routes for LoRA adapters: `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` and
`POST /v1/unload_lora_adapter {"lora_name"}` (routed only with lora.allow_runtime_updates; behind
the API key like every /v1 route). Errors in the OpenAI shape: a bad adapter 400, an unknown
name 404; reading an adapter's files runs on a worker thread, never on the event loop."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aiohttp import web
from rillet.core.errors import AdapterError, AdapterErrorKind
from rillet.http.engine_api import LoraEngine
from rillet.http.handlers import STATE, read_json
from rillet.http.openai.errors import ApiError, bad_request

_STATUS = {
    AdapterErrorKind.INVALID: (400, "invalid_lora_adapter"),
    AdapterErrorKind.EXISTS: (400, "lora_adapter_exists"),
    AdapterErrorKind.NOT_FOUND: (404, "lora_adapter_not_found"),
    AdapterErrorKind.DISABLED: (400, "lora_updates_disabled"),
}


def _api_error(exc: AdapterError) -> ApiError:
    status, code = _STATUS[exc.kind]
    return ApiError(status, exc.message, param="lora_name" if status == 404 else None, code=code)


def _name(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise bad_request(f"'{key}' must be a non-empty string", param=key, code="missing_required_parameter")
    return value


async def load_lora_adapter(request: web.Request) -> web.Response:
    state = request.app[STATE]
    engine = cast(LoraEngine, state.ready_engine())
    body = await read_json(request)
    name, path = _name(body, "lora_name"), _name(body, "lora_path")
    try:
        await asyncio.get_running_loop().run_in_executor(None, engine.load_lora, name, path)
    except AdapterError as exc:
        raise _api_error(exc) from exc
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    state = request.app[STATE]
    engine = cast(LoraEngine, state.ready_engine())
    name = _name(await read_json(request), "lora_name")
    try:
        engine.unload_lora(name)
    except AdapterError as exc:
        raise _api_error(exc) from exc
    state.metrics.forget_adapter(name)
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
