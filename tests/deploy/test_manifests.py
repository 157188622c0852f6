"""Every manifest deploy/ renders (the base and both overlays) is one the API server accepts:
the core kinds checked by kubernetes-validate against Kubernetes' own schemas, strict (an
unknown field is an error), for the oldest Kubernetes the manifests need (1.30: the preStop
sleep action) and the newest the package knows; the custom resources by test_inference_pool.py."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from deploy_kit.crd import SCHEMA_FILES
from deploy_kit.manifests import TARGETS, one, render

VERSIONS = ("1.30", kubernetes_validate.latest_version())
CORE_KINDS = {"ConfigMap", "Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_core_kinds_are_valid(target: str, version: str) -> None:
    checked = 0
    for doc in render(target):
        if doc["kind"] in CORE_KINDS:
            kubernetes_validate.validate(doc, version, strict=True)
            checked += 1
    assert checked >= len(CORE_KINDS)


@pytest.mark.parametrize("target", TARGETS)
def test_every_kind_is_checked_somewhere(target: str) -> None:
    kinds = {d["kind"] for d in render(target)}
    assert kinds <= CORE_KINDS | set(SCHEMA_FILES), kinds - CORE_KINDS - set(SCHEMA_FILES)
    names = [(d["kind"], d["metadata"]["name"]) for d in render(target)]
    assert len(names) == len(set(names))


def test_strict_validation_catches_a_misspelt_field() -> None:
    doc = copy.deepcopy(one(render("base"), "Deployment", "rillet"))
    doc["spec"]["template"]["spec"]["containers"][0]["readynessProbe"] = {"httpGet": {"path": "/health"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, VERSIONS[0], strict=True)
