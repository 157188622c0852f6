"""The endpoint picker's configuration (deploy/base/epp-config.yaml) reads the series rillet
exports, by the Model Server Protocol's names, from the pods and the port rillet serves them on;
its plugins are ones llm-d-router v0.10.0 registers and its references resolve; the picker's
Deployment mounts that file and may read what it watches."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from deploy_kit.manifests import TARGETS, one, pod_labels, pod_spec, render, selects
from deploy_kit.model_server_protocol import MODEL_SERVER_PROTOCOL

# Plugin types deploy/ uses, as llm-d-router v0.10.0 registers them (cmd/epp/runner/runner.go),
# with the kind of each: a profile holds scorers (weighted) and one picker.
PLUGIN_KINDS = {
    "metrics-data-source": "source",
    "core-metrics-extractor": "extractor",
    "queue-scorer": "scorer",
    "running-requests-size-scorer": "scorer",
    "kv-cache-utilization-scorer": "scorer",
    "lora-affinity-scorer": "scorer",
    "prefix-cache-scorer": "scorer",
    "max-score-picker": "picker",
    "single-profile-handler": "profile-handler",
}


# The picker decodes its config and each plugin's parameters strictly (an unknown field stops it):
# the fields of llm-d-router v0.10.0's types (apix/config/v1alpha1/endpointpickerconfig_types.go,
# the metrics source's and extractor's parameter structs) that deploy/ may use.
CONFIG_FIELDS = {
    "": {"apiVersion", "kind", "featureGates", "plugins", "schedulingProfiles", "dataLayer", "flowControl"},
    "plugins[]": {"name", "type", "parameters"},
    "schedulingProfiles[]": {"name", "plugins"},
    "schedulingProfiles[].plugins[]": {"pluginRef", "weight"},
    "dataLayer": {"sources"},
    "dataLayer.sources[]": {"pluginRef", "extractors"},
    "dataLayer.sources[].extractors[]": {"pluginRef"},
}
PARAMETER_FIELDS = {
    "metrics-data-source": {"scheme", "path", "port", "insecureSkipVerify", "interval"},
    "core-metrics-extractor": {"engineLabelKey", "defaultEngine", "engineConfigs"},
    "core-metrics-extractor.engineConfigs[]": {"name", *MODEL_SERVER_PROTOCOL},
}


def picker_config(target: str) -> dict[str, Any]:
    text = one(render(target), "ConfigMap", "rillet-epp-config")["data"]["epp-config.yaml"]
    config = yaml.safe_load(text)
    assert (config["apiVersion"], config["kind"]) == ("llm-d.ai/v1alpha1", "EndpointPickerConfig")
    return dict(config)


def _plugins(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Plugins by name (a plugin's name defaults to its type)."""
    named = {p.get("name", p["type"]): p for p in config["plugins"]}
    assert len(named) == len(config["plugins"])
    return named


def _of_type(config: dict[str, Any], plugin_type: str) -> dict[str, Any]:
    (found,) = [p for p in config["plugins"] if p["type"] == plugin_type]
    return dict(found)


@pytest.mark.parametrize("target", TARGETS)
def test_the_picker_reads_the_model_server_protocols_series(target: str) -> None:
    params = _of_type(picker_config(target), "core-metrics-extractor")["parameters"]
    (engine,) = [e for e in params["engineConfigs"] if e["name"] == params["defaultEngine"]]
    assert {k: v for k, v in engine.items() if k != "name"} == MODEL_SERVER_PROTOCOL


@pytest.mark.parametrize("target", TARGETS)
def test_the_pool_pods_carry_the_engine_label(target: str) -> None:
    docs = render(target)
    params = _of_type(picker_config(target), "core-metrics-extractor")["parameters"]
    pool = one(docs, "InferencePool", "rillet")["spec"]["selector"]["matchLabels"]
    for deployment in (d for d in docs if d["kind"] == "Deployment" and selects(pool, pod_labels(d))):
        assert pod_labels(deployment)[params["engineLabelKey"]] == params["defaultEngine"]


@pytest.mark.parametrize("target", TARGETS)
def test_metrics_are_scraped_on_the_pools_port_at_metrics(target: str) -> None:
    params = _of_type(picker_config(target), "metrics-data-source")["parameters"]
    assert (params["scheme"], params["path"]) == ("http", "/metrics")
    assert "port" not in params  # the InferencePool's target port: rillet's server.port


@pytest.mark.parametrize("target", TARGETS)
def test_plugins_are_registered_and_references_resolve(target: str) -> None:
    config = picker_config(target)
    plugins = _plugins(config)
    assert {p["type"] for p in plugins.values()} <= set(PLUGIN_KINDS)
    (source,) = config["dataLayer"]["sources"]
    assert PLUGIN_KINDS[plugins[source["pluginRef"]]["type"]] == "source"
    assert [PLUGIN_KINDS[plugins[e["pluginRef"]]["type"]] for e in source["extractors"]] == ["extractor"]
    (profile,) = config["schedulingProfiles"]
    kinds = [PLUGIN_KINDS[plugins[p["pluginRef"]]["type"]] for p in profile["plugins"]]
    assert kinds.count("picker") == 1
    for ref, kind in zip(profile["plugins"], kinds, strict=True):
        assert (kind == "scorer") == ("weight" in ref), ref
    scorers = {
        plugins[p["pluginRef"]]["type"]
        for p, k in zip(profile["plugins"], kinds, strict=True)
        if k == "scorer"
    }
    assert scorers == {t for t, k in PLUGIN_KINDS.items() if k == "scorer"}  # every one configured is used


@pytest.mark.parametrize("target", TARGETS)
def test_the_picker_mounts_its_config_and_may_read_what_it_watches(target: str) -> None:
    docs = render(target)
    picker = one(docs, "Deployment", "rillet-epp")
    (epp,) = pod_spec(picker)["containers"]
    (config_file,) = [a.split("=", 1)[1] for a in epp["args"] if a.startswith("--config-file=")]
    folder, key = config_file.rsplit("/", 1)
    (mount,) = [m for m in epp["volumeMounts"] if m["mountPath"] == folder]
    (volume,) = [v for v in pod_spec(picker)["volumes"] if v["name"] == mount["name"]]
    assert key in one(docs, "ConfigMap", volume["configMap"]["name"])["data"]

    account = pod_spec(picker)["serviceAccountName"]
    binding = one(docs, "RoleBinding", account)
    assert {"kind": "ServiceAccount", "name": account} in binding["subjects"]
    rules = one(docs, "Role", binding["roleRef"]["name"])["rules"]
    pool_group = one(docs, "InferencePool", "rillet")["apiVersion"].split("/")[0]
    (objective,) = [d for d in docs if d["kind"] == "InferenceObjective"]
    for group, resource in (
        ("", "pods"),
        (pool_group, "inferencepools"),
        (objective["apiVersion"].split("/")[0], "inferenceobjectives"),
    ):
        assert any(
            group in r["apiGroups"]
            and resource in r["resources"]
            and {"get", "list", "watch"} <= set(r["verbs"])
            for r in rules
        ), (group, resource)


def _fields(node: Any, path: str = "") -> dict[str, set[str]]:
    """The keys found at each path of a YAML tree (list items as `[]`)."""
    found: dict[str, set[str]] = {}
    items = node if isinstance(node, list) else [node]
    for item in items:
        if isinstance(item, dict):
            found.setdefault(path, set()).update(item)
            for key, value in item.items():
                if isinstance(value, (dict, list)) and key != "parameters":
                    sub = f"{path}.{key}" if path else key
                    for p, keys in _fields(value, sub + ("[]" if isinstance(value, list) else "")).items():
                        found.setdefault(p, set()).update(keys)
    return found


@pytest.mark.parametrize("target", TARGETS)
def test_fields_are_ones_the_pickers_strict_decoder_knows(target: str) -> None:
    config = picker_config(target)
    for path, keys in _fields(config).items():
        assert keys <= CONFIG_FIELDS[path], (path, keys - CONFIG_FIELDS[path])
    for plugin in config["plugins"]:
        params = plugin.get("parameters", {})
        assert set(params) <= PARAMETER_FIELDS.get(plugin["type"], set()), plugin
        for engine in params.get("engineConfigs", []):
            assert set(engine) <= PARAMETER_FIELDS[f"{plugin['type']}.engineConfigs[]"], engine
