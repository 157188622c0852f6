"""Kubernetes' strategic merge patch, as far as deploy/'s overlays use it: on a Deployment's pod
template, maps merge key by key, the lists Kubernetes merges (containers by name, volumes by
name, ...) merge item by item on their key, every other list is replaced, and a null deletes
the key. Anything beyond that (`$patch` directives, another kind) is refused, not approximated."""

from __future__ import annotations

import copy
from typing import Any

# patchMergeKey of the PodSpec and Container lists (k8s.io/api/core/v1 types.go); lists of a field
# not named here have no merge strategy in Kubernetes either: a patch replaces them whole.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "env": "name",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}
PATCHABLE_KINDS = frozenset({("apps/v1", "Deployment")})


class UnsupportedPatch(ValueError):
    """A patch this small implementation would get wrong."""


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """The patched copy of `target`."""
    if (patch.get("apiVersion"), patch.get("kind")) not in PATCHABLE_KINDS:
        raise UnsupportedPatch(f"patches of {patch.get('kind')} ({patch.get('apiVersion')})")
    return _merge_map(copy.deepcopy(target), patch)


def _merge_map(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    for key, value in patch.items():
        if key.startswith("$"):
            raise UnsupportedPatch(f"directive {key}")
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            target[key] = _merge_map(target[key], value)
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(target.get(key), list):
            target[key] = _merge_list(target[key], value, MERGE_KEYS[key])
        else:
            target[key] = copy.deepcopy(value)
    return target


def _merge_list(target: list[Any], patch: list[Any], key: str) -> list[Any]:
    """Items of `patch` merged into the item of `target` with the same `key` value; new ones are
    appended in the patch's order (kustomize's order)."""
    out = list(target)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise UnsupportedPatch(f"a list item without its merge key {key!r}: {item!r}")
        if any(k.startswith("$") for k in item):
            raise UnsupportedPatch(f"a directive in {item!r}")
        at = next((i for i, old in enumerate(out) if old.get(key) == item[key]), None)
        if at is None:
            out.append(copy.deepcopy(item))
        else:
            out[at] = _merge_map(out[at], item)
    return out
