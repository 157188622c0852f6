"""The model-server pods run the rillet they describe: the config rillet itself loads from the
mounted ConfigMap and the container's arguments (rillet's own parser and validation) listens on
the container port the probes, the Service and the pool use; model.cache_dir is a volume; the
grace period covers the preStop sleep and the drain; each overlay asks for what it runs on."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from deploy_kit.kustomize import split_image
from deploy_kit.manifests import DEPLOY, OVERLAYS, TARGETS, container, container_port, one, pod_spec, render
from rillet.core.config import RilletConfig, load_config
from rillet.http.cli import build_parser, overrides_from

PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def _server(target: str) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = one(render(target), "Deployment", "rillet")
    return pod_spec(deployment), container(deployment, "rillet")


def effective_config(target: str, tmp_path: Path) -> RilletConfig:
    """What `rillet serve` makes of the pod's command line and the ConfigMap file it names."""
    docs = render(target)
    spec, server = _server(target)
    assert server["command"] == ["rillet"]
    args = build_parser().parse_args(server["args"])
    assert args.command == "serve"
    mount = Path(args.config).parent
    (volume_mount,) = [m for m in server["volumeMounts"] if Path(m["mountPath"]) == mount]
    (volume,) = [v for v in spec["volumes"] if v["name"] == volume_mount["name"]]
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    path = tmp_path / "rillet.yaml"
    path.write_text(config_map["data"][Path(args.config).name], encoding="utf-8")
    return load_config(str(path), overrides_from(args))


@pytest.mark.parametrize("target", TARGETS)
def test_rillet_listens_where_the_probes_and_the_pool_look(target: str, tmp_path: Path) -> None:
    cfg = effective_config(target, tmp_path)
    spec, server = _server(target)
    assert cfg.server.host in ("0.0.0.0", "::")  # the pod's address, not loopback
    assert container_port(spec["containers"], "http") == cfg.server.port
    for probe in PROBES:
        get = server[probe]["httpGet"]
        assert get["path"] == "/health", probe
        assert container_port(spec["containers"], get["port"]) == cfg.server.port, probe
    assert one(render(target), "InferencePool", "rillet")["spec"]["targetPorts"] == [
        {"number": cfg.server.port}
    ]


@pytest.mark.parametrize("target", TARGETS)
def test_the_cache_dir_is_a_volume_of_its_own(target: str, tmp_path: Path) -> None:
    cfg = effective_config(target, tmp_path)
    spec, server = _server(target)
    assert cfg.model.cache_dir is not None
    (mount,) = [m for m in server["volumeMounts"] if m["mountPath"] == cfg.model.cache_dir]
    assert not mount.get("readOnly", False)
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume  # one per pod: the saved steps' store is not shared between pods
    env = {e["name"]: e["value"] for e in server["env"]}
    assert env["TORCH_EXTENSIONS_DIR"].startswith(cfg.model.cache_dir + "/")


@pytest.mark.parametrize("target", TARGETS)
def test_the_grace_period_covers_the_prestop_sleep_and_the_drain(target: str, tmp_path: Path) -> None:
    cfg = effective_config(target, tmp_path)
    spec, server = _server(target)
    sleep = server["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert spec["terminationGracePeriodSeconds"] >= sleep + cfg.server.drain_timeout_s + 10
    # the liveness probe gives a stalled process a minute, no less than a readiness flap
    live = server["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 60


def _resources(target: str) -> dict[str, dict[str, str]]:
    return dict(_server(target)[1]["resources"])


def test_the_gpu_overlay_asks_for_a_gpu_and_runs_on_it(tmp_path: Path) -> None:
    res = _resources("overlays/gpu")
    assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == "1"
    assert effective_config("overlays/gpu", tmp_path).model.device == "cuda"
    spec, _ = _server("overlays/gpu")
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    for target in ("base", "overlays/cpu"):
        assert not any("nvidia.com/gpu" in r for r in _resources(target).values())


def test_the_cpu_overlay_runs_one_torch_thread_a_core(tmp_path: Path) -> None:
    res = _resources("overlays/cpu")
    assert res["requests"]["cpu"] == res["limits"]["cpu"]  # whole cores, Guaranteed QoS
    assert res["requests"]["memory"] == res["limits"]["memory"]
    assert effective_config("overlays/cpu", tmp_path).model.num_threads == int(res["limits"]["cpu"])


@pytest.mark.parametrize(("target", "tag"), [("overlays/cpu", "0.1.0-cpu"), ("overlays/gpu", "0.1.0-cuda")])
def test_each_overlay_names_its_image(target: str, tag: str) -> None:
    assert split_image(_server(target)[1]["image"]) == ("rillet", tag)
    dockerfile = "cpu" if target.endswith("cpu") else "gpu"
    assert f"rillet:{tag}" in (DEPLOY / "docker" / f"{dockerfile}.Dockerfile").read_text(encoding="utf-8")


@pytest.mark.parametrize("target", OVERLAYS)
def test_the_images_user_and_cache_are_the_pods(target: str, tmp_path: Path) -> None:
    dockerfile = "cpu" if target.endswith("cpu") else "gpu"
    text = (DEPLOY / "docker" / f"{dockerfile}.Dockerfile").read_text(encoding="utf-8")
    spec, _ = _server(target)
    assert re.search(rf"^USER {spec['securityContext']['runAsUser']}$", text, re.M)
    cache_dir = effective_config(target, tmp_path).model.cache_dir
    assert f"mkdir -p {cache_dir} && chown rillet:rillet {cache_dir}" in text
    (expose,) = re.findall(r"^EXPOSE (\d+)$", text, re.M)
    assert int(expose) == effective_config(target, tmp_path).server.port
