"""Custom resources checked against their CRD's openAPIV3Schema (vendored under
tests/deploy/data/ with its source), as the API server with strict field validation (kubectl's
default) checks them: an unknown field is an error, so every object schema that lists its
properties gets additionalProperties: false. `metadata` stays open (the API server checks it as
ObjectMeta). The CRD's CEL rules (x-kubernetes-validations) are not evaluated here: `cel_rules`
lists them, for the tests to check each one themselves."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

DATA = Path(__file__).resolve().parents[2] / "deploy" / "data"
SCHEMA_FILES = {
    "InferencePool": "inferencepool-v1.schema.yaml",
    "InferenceObjective": "inferenceobjective-v1alpha2.schema.yaml",
}


@dataclass(frozen=True)
class Crd:
    group: str
    version: str
    kind: str
    schema: dict[str, Any]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


def load(kind: str) -> Crd:
    data = yaml.safe_load((DATA / SCHEMA_FILES[kind]).read_text(encoding="utf-8"))
    return Crd(data["group"], data["version"], data["kind"], data["openAPIV3Schema"])


def errors(doc: dict[str, Any], crd: Crd) -> list[str]:
    """What the API server would refuse in `doc` (CEL rules apart), one line each."""
    validator = jsonschema.Draft7Validator(strict(crd.schema))
    found = [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(doc)
    ]
    if doc.get("apiVersion") != crd.api_version or doc.get("kind") != crd.kind:
        found.append(
            f"apiVersion/kind {doc.get('apiVersion')}/{doc.get('kind')}, not {crd.api_version}/{crd.kind}"
        )
    return found


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(schema)
    _close(out, top=True)
    return out


def _close(node: dict[str, Any], top: bool = False) -> None:
    props = node.get("properties")
    if isinstance(props, dict):
        node.setdefault("additionalProperties", False)
        for name, sub in props.items():
            if not (top and name == "metadata"):
                _close(sub)
    if isinstance(node.get("items"), dict):
        _close(node["items"])
    if isinstance(node.get("additionalProperties"), dict):
        _close(node["additionalProperties"])


def cel_rules(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, str]]:
    """(path, rule) of every x-kubernetes-validations rule in the schema."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield path or "<root>", rule["rule"]
    for name, sub in schema.get("properties", {}).items():
        yield from cel_rules(sub, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), dict):
        yield from cel_rules(schema["items"], f"{path}[]")
