"""deploy/'s rendered targets and the lookups the tests make in them: one object by kind and
name, a Deployment's pod labels and containers, whether a selector selects, which container port
a Service's or a probe's port names."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from deploy_kit.kustomize import Manifest, build

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
TARGETS = ("base", "overlays/cpu", "overlays/gpu")
OVERLAYS = ("overlays/cpu", "overlays/gpu")


@functools.cache
def _rendered(target: str) -> tuple[Manifest, ...]:
    return tuple(build(DEPLOY / target))


def render(target: str) -> list[Manifest]:
    """The target's manifests (a fresh list each call; the objects are shared: do not modify them)."""
    return list(_rendered(target))


def one(docs: list[Manifest], kind: str, name: str) -> Manifest:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def pod_labels(deployment: Manifest) -> dict[str, str]:
    return dict(deployment["spec"]["template"]["metadata"]["labels"])


def pod_spec(deployment: Manifest) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"])


def container(deployment: Manifest, name: str) -> dict[str, Any]:
    (found,) = [c for c in pod_spec(deployment)["containers"] if c["name"] == name]
    return dict(found)


def selects(match_labels: dict[str, str], labels: dict[str, str]) -> bool:
    """A matchLabels selector (or a Service's selector) selects these labels; an empty one selects
    nothing here (no selector in deploy/ means to select everything)."""
    return bool(match_labels) and all(labels.get(k) == v for k, v in match_labels.items())


def container_port(containers: list[dict[str, Any]], port: int | str) -> int | None:
    """The container port a probe's, or a Service's targetPort, names (by number or by name)."""
    for c in containers:
        for p in c.get("ports", []):
            if port in (p["containerPort"], p.get("name")):
                return int(p["containerPort"])
    return None
