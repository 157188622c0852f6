"""Errors the engine reports to its callers, by kind: nothing above the engine compares sentences.

`ErrorKind` travels with a request that ended in `FinishReason.ERROR` (on its `SeqDelta`), so a
front end maps each kind to its own status and shape. The exceptions are raised by
`Engine.add_request` on the caller's thread. Torch-free: the HTTP layer imports this module.
"""

from __future__ import annotations

import enum


class ErrorKind(enum.Enum):
    """Why one request failed (its other choices end with it)."""

    DEADLINE = "deadline"  # server.request_timeout_s ran out
    GRAMMAR = "grammar"  # its grammar refused the next token or gave out (the request's own grammar)
    MODEL = "model"  # the step's forward or sampling failed (the batch's requests fail, the engine goes on)
    OUTPUT = "output"  # detokenizing or stop-checking its token failed
    REJECTED = "rejected"  # the engine could not take it in (e.g. its grammar would not build)
    ENGINE_DEAD = "engine_dead"  # the engine thread died: nothing can be served any more


class QueueFullError(Exception):
    """The waiting queue is at `scheduler.max_waiting`: try again later (HTTP 429)."""


class EngineDeadError(Exception):
    """The engine thread has died; no request can be served (HTTP 503)."""


class RequestError(ValueError):
    """A request the engine refuses as given; `param` names the field at fault."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


class AdapterErrorKind(enum.Enum):
    """Why a LoRA adapter could not be loaded, unloaded or used."""

    INVALID = "invalid"  # the files are not an adapter this model can serve (HTTP 400)
    NOT_FOUND = "not_found"  # no adapter of that name is loaded (HTTP 404)
    EXISTS = "exists"  # an adapter of that name is loaded already (HTTP 400)
    DISABLED = "disabled"  # lora.allow_runtime_updates is off, or the model serves no adapters


class AdapterError(ValueError):
    """A LoRA adapter refused: `kind` says why, `name` is the adapter, the message says where
    (the file and the tensor)."""

    def __init__(self, kind: AdapterErrorKind, name: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.name = name
        self.message = message
