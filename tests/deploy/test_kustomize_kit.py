"""The tests' kustomize (tests/support/deploy_kit) renders deploy/ as kustomize does, and refuses
what it does not implement instead of passing over it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_kit.kustomize import build, split_image
from deploy_kit.strategic_merge import UnsupportedPatch, merge
from repo import REPO

TARGETS = ["base", "overlays/cpu", "overlays/gpu"]


def _by_name(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("target", TARGETS)
def test_renders_what_kubectl_kustomize_renders(target: str) -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "deploy" / target)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    theirs = _by_name([d for d in yaml.safe_load_all(out.stdout) if d])
    assert _by_name(build(REPO / "deploy" / target)) == theirs


DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "x"},
    "spec": {
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "a",
                        "image": "a",
                        "args": ["serve", "--port", "1"],
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                        "env": [{"name": "A", "value": "1"}],
                    },
                    {"name": "b", "image": "b"},
                ],
                "volumes": [{"name": "v", "emptyDir": {}}],
                "tolerations": [{"key": "k", "operator": "Exists"}],
            }
        }
    },
}


def test_strategic_merge_merges_keyed_lists_and_replaces_the_others() -> None:
    patch = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "a",
                            "args": ["serve"],
                            "resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "4"}},
                            "env": [{"name": "B", "value": "2"}],
                        }
                    ],
                    "volumes": [{"name": "w", "emptyDir": {}}],
                    "tolerations": [{"key": "g", "operator": "Exists"}],
                }
            }
        },
    }
    spec = merge(DEPLOYMENT, patch)["spec"]["template"]["spec"]
    a, b = spec["containers"]
    assert a["args"] == ["serve"]  # a list without a merge key: replaced
    assert a["resources"] == {"requests": {"cpu": "4", "memory": "1Gi"}, "limits": {"cpu": "4"}}
    assert [e["name"] for e in a["env"]] == ["A", "B"]
    assert b == {"name": "b", "image": "b"}
    assert [v["name"] for v in spec["volumes"]] == ["v", "w"]
    assert spec["tolerations"] == [{"key": "g", "operator": "Exists"}]
    assert DEPLOYMENT["spec"]["template"]["spec"]["containers"][0]["args"] == ["serve", "--port", "1"]


def test_a_null_deletes_and_directives_are_refused() -> None:
    patch = {**DEPLOYMENT, "spec": {"template": {"spec": {"tolerations": None}}}}
    assert "tolerations" not in merge(DEPLOYMENT, patch)["spec"]["template"]["spec"]
    with pytest.raises(UnsupportedPatch):
        merge(DEPLOYMENT, {**DEPLOYMENT, "spec": {"template": {"spec": {"$patch": "replace"}}}})
    with pytest.raises(UnsupportedPatch):
        merge(DEPLOYMENT, {**DEPLOYMENT, "kind": "Service", "apiVersion": "v1"})


def _kustomization(folder: Path, **fields: object) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "d.yaml").write_text(yaml.safe_dump(DEPLOYMENT))
    (folder / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["d.yaml"], **fields}))
    return folder


def test_fields_it_does_not_implement_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedPatch, match="namePrefix"):
        build(_kustomization(tmp_path / "k", namePrefix="p-"))
    with pytest.raises(UnsupportedPatch, match="matches no container"):
        build(_kustomization(tmp_path / "i", images=[{"name": "nope", "newTag": "1"}]))


def test_images_keep_a_registry_port_apart_from_the_tag(tmp_path: Path) -> None:
    assert split_image("registry.local:5000/rillet:0.1.0-cpu") == ("registry.local:5000/rillet", "0.1.0-cpu")
    assert split_image("registry.local:5000/rillet") == ("registry.local:5000/rillet", None)
    docs = build(_kustomization(tmp_path / "k", images=[{"name": "b", "newName": "r:5000/b", "newTag": "2"}]))
    assert docs[0]["spec"]["template"]["spec"]["containers"][1]["image"] == "r:5000/b:2"
