"""deploy/k8s/tinker, the Tinker-compatible service's base, and the overlay the renderer makes
of a tinker job over it: both build with kustomize and validate against the Kubernetes
schemas (strict); the pod runs the plan's one process on the config's port, listening on
every interface with TLS and the keys from their Secrets (mounted where the config reads
them, never inlined), its state on the volume, its probes asking the health route over HTTPS;
the base's own job is the shipped tinker config with the renderer's cluster settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from hybridflow.deploy.k8s import TINKER_CLUSTER, render_overlay
from hybridflow.job.plan import plan
from hybridflow.job_config import load_job_config
from tests.unit.deploy.test_k8s_manifests import (
    SCHEMA_VERSIONS,
    by_kind,
    containers,
    job_config,
    pod_spec,
    render,
)

REPO = Path(__file__).resolve().parents[3]
BASE = REPO / "deploy" / "k8s" / "tinker"
CONFIG = REPO / "deploy" / "configs" / "tinker.yaml"


@pytest.fixture(params=["base", "rendered"])
def objects(request: pytest.FixtureRequest, tmp_path: Path) -> list[dict[str, Any]]:
    if request.param == "base":
        return render(BASE)
    render_overlay(CONFIG, ["tinker.max_tenants=3"], tmp_path / "overlay")
    return render(tmp_path / "overlay")


def test_the_objects_validate_against_the_kubernetes_schemas(objects):
    assert sorted(o["kind"] for o in objects) == [
        "ConfigMap", "Deployment", "PersistentVolumeClaim", "Service",
    ]  # fmt: skip
    for version in SCHEMA_VERSIONS:
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_pod_runs_the_plans_process_on_its_port_with_tls_keys_and_state(objects, tmp_path):
    job = job_config(objects, tmp_path)
    main = plan(job).main
    assert main.role == "tinker" and job.tinker.enabled
    (deployment,) = by_kind(objects, "Deployment").values()
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"  # one writer of the state
    (container,) = containers(objects)
    assert container["command"] == ["python", "-m", main.module]
    assert container["args"][0] == "--config=/etc/hybridflow/job.yaml"
    run_dir = container["args"][1].removeprefix("--run-dir=")
    (port,) = container["ports"]
    assert (job.tinker.host, job.tinker.port) == ("0.0.0.0", port["containerPort"])
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == ("/api/v1/healthz", "https", "HTTPS")
    (service,) = by_kind(objects, "Service").values()
    assert service["spec"]["ports"][0]["targetPort"] == "https"

    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    secrets = {
        volumes[n]["secret"]["secretName"]: mounts[n] for n in volumes if "secret" in volumes[n]
    }
    assert Path(job.tinker.tls_cert).parent == Path(secrets["hybridflow-tls"])
    assert Path(job.tinker.tls_key).parent == Path(secrets["hybridflow-tls"])
    assert Path(job.tinker.keys_file).parent == Path(secrets["hybridflow-tinker-keys"])
    token = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]}
    assert token == {"HYBRIDFLOW_TOKEN": "hybridflow-token"}
    assert not [o for o in objects if o["kind"] == "Secret"]  # referenced, never inlined
    assert job.tinker.state_dir == ""  # so the state is <run dir>/tinker, on the volume
    (claim,) = by_kind(objects, "PersistentVolumeClaim")
    state = next(n for n, v in volumes.items() if "persistentVolumeClaim" in v)
    assert volumes[state]["persistentVolumeClaim"]["claimName"] == claim
    assert Path(run_dir).is_relative_to(mounts[state])
    assert job.deploy.run_root == mounts[state]


def test_the_bases_job_is_the_shipped_config_in_the_renderers_cluster_settings(tmp_path):
    assert job_config(render(BASE), tmp_path) == load_job_config(CONFIG, list(TINKER_CLUSTER))


def test_the_rendered_overlay_carries_the_jobs_own_settings(tmp_path):
    render_overlay(CONFIG, ["tinker.max_tenants=3"], tmp_path / "overlay")
    assert job_config(render(tmp_path / "overlay"), tmp_path).tinker.max_tenants == 3
