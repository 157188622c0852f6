"""`kustomize build` for deploy/'s kustomizations: `resources` (files, and folders holding a
kustomization), `patches` given by `path` (strategic merges, strategic_merge.py) and `images`.
A field it does not implement is an error, never skipped, so a test cannot pass on a manifest
whose meaning it did not read. Where kubectl is installed, tests/deploy/test_kustomize_kit.py
checks it renders what `kubectl kustomize` renders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from deploy_kit.strategic_merge import UnsupportedPatch, merge

Manifest = dict[str, Any]
SUPPORTED_FIELDS = frozenset({"apiVersion", "kind", "resources", "patches", "images"})
IMAGE_FIELDS = frozenset({"name", "newName", "newTag", "digest"})


def build(folder: Path) -> list[Manifest]:
    """The manifests of the kustomization in `folder`, in kustomize's order (resources as listed)."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(kustomization) - SUPPORTED_FIELDS
    if unknown:
        raise UnsupportedPatch(f"{folder}/kustomization.yaml: fields {sorted(unknown)}")
    docs: list[Manifest] = []
    for entry in kustomization.get("resources", []):
        path = folder / entry
        docs += build(path) if path.is_dir() else load_all(path)
    for patch in kustomization.get("patches", []):
        if set(patch) != {"path"}:
            raise UnsupportedPatch(f"{folder}: a patch other than a file's strategic merge: {patch}")
        for doc in load_all(folder / patch["path"]):
            at = _target(docs, doc)
            docs[at] = merge(docs[at], doc)
    for image in kustomization.get("images", []):
        _set_image(docs, image)
    return docs


def load_all(path: Path) -> list[Manifest]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _target(docs: list[Manifest], patch: Manifest) -> int:
    name = patch["metadata"]["name"]
    found = [i for i, d in enumerate(docs) if (d["kind"], d["metadata"]["name"]) == (patch["kind"], name)]
    if len(found) != 1:
        raise UnsupportedPatch(f"a patch of {patch['kind']}/{name} matches {len(found)} resources")
    return found[0]


def _set_image(docs: list[Manifest], image: dict[str, str]) -> None:
    """kustomize's image transformer on the pod templates' containers; an entry that matches no
    container is an error (kustomize would ignore it: an override that silently does nothing)."""
    if set(image) - IMAGE_FIELDS or "name" not in image:
        raise UnsupportedPatch(f"images entry {image}")
    hits = 0
    for container in _containers(docs):
        name, tag = split_image(container["image"])
        if name != image["name"]:
            continue
        hits += 1
        new = image.get("newName", name)
        if "digest" in image:
            container["image"] = f"{new}@{image['digest']}"
        else:
            tag = image.get("newTag", tag)
            container["image"] = f"{new}:{tag}" if tag else new
    if hits == 0:
        raise UnsupportedPatch(f"images entry {image['name']!r} matches no container")


def split_image(ref: str) -> tuple[str, str | None]:
    """(name, tag) of an image reference; a digest counts as part of the name here."""
    if "@" in ref:
        return ref, None
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        return ref[:colon], ref[colon + 1 :]
    return ref, None


def _containers(docs: list[Manifest]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        out += spec.get("containers", []) + spec.get("initContainers", [])
    return out
