"""The InferencePool and InferenceObjective against their CRDs' schemas (tests/deploy/data/, with
their sources), the CRD's CEL rules checked by hand, and the references between the objects:
the pool selects the model-server pods and nothing else, its target port is their serving port
and the Service's, its endpoint picker is a Service that reaches the picker's ext-proc port."""

from __future__ import annotations

import copy

import pytest
from deploy_kit import crd
from deploy_kit.manifests import TARGETS, container_port, one, pod_labels, pod_spec, render, selects

POOL_CEL_RULES = {
    ("spec.endpointPickerRef", "self.kind != 'Service' || has(self.port)"),
    ("spec.targetPorts", "self.all(p1, self.exists_one(p2, p1.number==p2.number))"),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", sorted(crd.SCHEMA_FILES))
def test_custom_resources_match_their_crd(target: str, kind: str) -> None:
    schema = crd.load(kind)
    (doc,) = [d for d in render(target) if d["kind"] == kind]
    assert crd.errors(doc, schema) == []


def test_the_schema_check_catches_an_unknown_field_and_a_missing_one() -> None:
    pool = copy.deepcopy(one(render("base"), "InferencePool", "rillet"))
    pool["spec"]["targetPort"] = pool["spec"].pop("targetPorts")
    found = crd.errors(pool, crd.load("InferencePool"))
    assert any("targetPort" in e and "unexpected" in e for e in found), found
    assert any("'targetPorts' is a required property" in e for e in found), found


def test_the_pools_cel_rules_hold() -> None:
    """The CRD's CEL rules (x-kubernetes-validations), evaluated here by hand: the set is pinned,
    so a re-vendored schema with a new rule fails until the rule is checked here too."""
    schema = crd.load("InferencePool").schema
    assert set(crd.cel_rules(schema)) == POOL_CEL_RULES
    for target in TARGETS:
        spec = one(render(target), "InferencePool", "rillet")["spec"]
        ref = spec["endpointPickerRef"]
        assert ref.get("kind", "Service") != "Service" or "port" in ref
        numbers = [p["number"] for p in spec["targetPorts"]]
        assert len(numbers) == len(set(numbers))


@pytest.mark.parametrize("target", TARGETS)
def test_the_pool_selects_the_model_servers_only(target: str) -> None:
    docs = render(target)
    pool = one(docs, "InferencePool", "rillet")["spec"]["selector"]["matchLabels"]
    selected = [
        d["metadata"]["name"] for d in docs if d["kind"] == "Deployment" and selects(pool, pod_labels(d))
    ]
    assert selected == ["rillet"]


@pytest.mark.parametrize("target", TARGETS)
def test_target_ports_are_the_serving_port_of_the_pods_and_the_service(target: str) -> None:
    docs = render(target)
    pods = pod_spec(one(docs, "Deployment", "rillet"))["containers"]
    pool = one(docs, "InferencePool", "rillet")["spec"]
    service = one(docs, "Service", "rillet")["spec"]
    serving = container_port(pods, "http")
    assert [p["number"] for p in pool["targetPorts"]] == [serving]
    assert [container_port(pods, p["targetPort"]) for p in service["ports"]] == [serving]
    assert service["selector"] == pool["selector"]["matchLabels"]


@pytest.mark.parametrize("target", TARGETS)
def test_every_service_selects_one_deployment_and_reaches_its_ports(target: str) -> None:
    docs = render(target)
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    for service in (d for d in docs if d["kind"] == "Service"):
        (backend,) = [d for d in deployments if selects(service["spec"]["selector"], pod_labels(d))]
        for port in service["spec"]["ports"]:
            assert container_port(pod_spec(backend)["containers"], port["targetPort"]) is not None, port
    for deployment in deployments:
        assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels(deployment))


@pytest.mark.parametrize("target", TARGETS)
def test_the_endpoint_picker_ref_reaches_the_pickers_ext_proc_port(target: str) -> None:
    docs = render(target)
    ref = one(docs, "InferencePool", "rillet")["spec"]["endpointPickerRef"]
    assert ref.get("kind", "Service") == "Service" and ref.get("group", "") == ""
    service = one(docs, "Service", ref["name"])
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    assert port["appProtocol"] == "kubernetes.io/h2c"  # ext-proc is gRPC
    picker = one(docs, "Deployment", "rillet-epp")
    assert selects(service["spec"]["selector"], pod_labels(picker))
    (epp,) = pod_spec(picker)["containers"]
    assert container_port([epp], port["targetPort"]) == 9002  # the picker's --grpc-port default
    assert "--grpc-port" not in " ".join(epp["args"])


@pytest.mark.parametrize("target", TARGETS)
def test_the_objective_and_the_picker_name_the_pool(target: str) -> None:
    docs = render(target)
    pool = one(docs, "InferencePool", "rillet")
    group = pool["apiVersion"].split("/")[0]
    (objective,) = [d for d in docs if d["kind"] == "InferenceObjective"]
    ref = objective["spec"]["poolRef"]
    assert (ref["group"], ref.get("kind", "InferencePool"), ref["name"]) == (group, "InferencePool", "rillet")
    (epp,) = pod_spec(one(docs, "Deployment", "rillet-epp"))["containers"]
    assert f"--pool-name={pool['metadata']['name']}" in epp["args"]
    assert f"--pool-group={group}" in epp["args"]
