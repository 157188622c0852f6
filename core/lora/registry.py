"""The adapters a server knows, by name: loaded from config at start-up and, when
`lora.allow_runtime_updates` is on, loaded and unloaded while serving (any thread).

An adapter is read and checked completely before its name is registered, so a request sees either
no adapter or a whole one. Unloading removes the name (new requests for it get NOT_FOUND); the
sequences already running keep their reference to the adapter and finish with it, and its slot
becomes an idle one that the next placement may take. Reloading a name gives a new adapter (a new
uid): blocks cached under the old one are never hit by it.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from rillet.core.config.lora import valid_adapter_name
from rillet.core.errors import AdapterError, AdapterErrorKind
from rillet.core.lora.adapter import LoraAdapter, read_adapter
from rillet.core.lora.stack import LoraStack
from rillet.core.model.arch import ModelArch

log = logging.getLogger(__name__)


@dataclass
class AdapterInfo:
    """What /v1/models and the metrics show of one adapter."""

    name: str
    path: str
    rank: int
    nbytes: int  # host bytes of its A and B


class LoraRegistry:
    def __init__(self, arch: ModelArch, stack: LoraStack, allow_updates: bool, first_uid: int = 1) -> None:
        self.arch = arch
        self.stack = stack
        self.allow_updates = allow_updates
        self._adapters: dict[str, LoraAdapter] = {}
        self._lock = threading.Lock()  # load / unload from HTTP worker threads
        self._uids = itertools.count(first_uid)

    def get(self, name: str) -> LoraAdapter:
        adapter = self._adapters.get(name)
        if adapter is None:
            raise AdapterError(AdapterErrorKind.NOT_FOUND, name, f"The model '{name}' does not exist")
        return adapter

    def __contains__(self, name: str) -> bool:
        return name in self._adapters

    def infos(self) -> list[AdapterInfo]:
        return [AdapterInfo(a.name, a.path, a.rank, a.nbytes) for a in list(self._adapters.values())]

    def load(self, name: str, path: str | Path, reserved: str, runtime: bool = True) -> LoraAdapter:
        """Reads, checks and registers an adapter (the whole file is read first: slow, so call it
        off the event loop). `reserved`: the base model's name, which no adapter may take."""
        if runtime and not self.allow_updates:
            raise AdapterError(
                AdapterErrorKind.DISABLED,
                name,
                "loading adapters while serving is off (lora.allow_runtime_updates)",
            )
        if not valid_adapter_name(name) or name == reserved:
            raise AdapterError(
                AdapterErrorKind.INVALID,
                name,
                f"'{name}' cannot name an adapter (1-128 of A-Z a-z 0-9 ._:@+-, parts joined by /, "
                "not the base model's name)",
            )
        if name in self._adapters:
            raise AdapterError(
                AdapterErrorKind.EXISTS, name, f"a LoRA adapter named '{name}' is already loaded"
            )
        with self._lock:
            uid = next(self._uids)
        adapter = read_adapter(name, path, self.arch, self.stack.rank, uid)
        self.add(adapter)
        log.info(
            "LoRA adapter '%s' loaded from %s (r %d, %.1f MB)",
            name,
            adapter.path,
            adapter.rank,
            adapter.nbytes / 1e6,
        )
        return adapter

    def add(self, adapter: LoraAdapter) -> None:
        """Registers an adapter already read: checked against the buffers first."""
        self.stack.check(adapter)
        with self._lock:
            if adapter.name in self._adapters:  # two loads of one name raced: the first one wins
                raise AdapterError(
                    AdapterErrorKind.EXISTS,
                    adapter.name,
                    f"a LoRA adapter named '{adapter.name}' is already loaded",
                )
            self._adapters[adapter.name] = adapter

    def unload(self, name: str) -> None:
        if not self.allow_updates:
            raise AdapterError(
                AdapterErrorKind.DISABLED,
                name,
                "unloading adapters while serving is off (lora.allow_runtime_updates)",
            )
        with self._lock:
            if self._adapters.pop(name, None) is None:
                raise AdapterError(
                    AdapterErrorKind.NOT_FOUND, name, f"no LoRA adapter named '{name}' is loaded"
                )
        log.info("LoRA adapter '%s' unloaded (requests already running finish with it)", name)
