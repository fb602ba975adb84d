"""Renders a job's plan (``hybridflow.job.plan``) as a kustomize overlay of ``deploy/k8s/base``
(of ``deploy/k8s/tinker`` for a Tinker-compatible service: its one pod, ``_tinker_overlay``).

    python -m hybridflow.deploy.k8s --config my-job.yaml [--set KEY=VALUE ...] --out DIR
    kubectl apply -k DIR

The overlay holds the job's resolved config with the cluster's settings (``job.yaml``, the
ConfigMap every pod reads), a Deployment and Service for each rollout replica past the
base's first (``rollout-<i>.yaml``, copied from the base's ``rollout-0.yaml``), the
environment component when the plan has an environment service, and a patch giving the
learner's StatefulSet the plan's ranks per pod and ``learner.topology.nnodes`` pods, with a
GPU per rank (and per replica) when the job runs on CUDA. The base's objects (probes, TLS
and token secrets, volumes) are kustomize's source; this module decides only what the plan
decides: which processes run, with what arguments, ranks, nodes and ports.

The cluster's settings: every service binds 0.0.0.0 on its port in ``PORTS`` with the TLS
files of the ``hybridflow-tls`` secret; the coordinator dials each at its Service's name
(the learner at its pod 0's stable name); the learner sends weights only to the replicas'
Services; runs and checkpoints go to ``/runs`` (the shared volume). Knows the plan, the
base's names and ports, not the services' internals.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from hybridflow.job.plan import ONE_PROCESS_JOBS, JobPlan, Process, plan
from hybridflow.job_config import JobConfig, load_job_config

BASE = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "base"
COMPONENTS = BASE.parent / "components"
PORTS = {"rollout": 50051, "reward": 50052, "learner": 50053, "environment": 50054}
"""The base's ports (its containers, probes and Services): a replica serves on the rollout
port plus its index."""
TLS_DIR = "/etc/hybridflow/tls"
RUNS = "/runs"
TINKER_BASE = BASE.parent / "tinker"
TINKER_PORT = 8000
TINKER_CLUSTER = (
    "tinker.host=0.0.0.0",
    f"tinker.port={TINKER_PORT}",
    f"tinker.tls_cert={TLS_DIR}/tls.crt",
    f"tinker.tls_key={TLS_DIR}/tls.key",
    "tinker.keys_file=/etc/hybridflow/tinker-keys/keys",
    "tinker.state_dir=",
    f"deploy.run_root={RUNS}",
)
"""A Tinker-compatible service's cluster settings, as ``deploy/k8s/tinker``'s pod has them
(its port, the Secrets' mounts; its state under the run directory on the state volume)."""
LEARNER_POD0 = "hybridflow-learner-0.hybridflow-learner"


def service_host(process: Process) -> str:
    """The name the coordinator (and the learner, for a replica) dials ``process`` at."""
    if process.role == "learner":
        return LEARNER_POD0
    if process.role == "rollout":
        return f"hybridflow-rollout-{process.port_offset}"
    return f"hybridflow-{process.role}"


def cluster_overrides(job_plan: JobPlan) -> list[str]:
    """The ``--set`` overrides that put a job on the cluster: sockets, TLS, addresses, the
    replicas' hosts, where runs and checkpoints go."""
    out = []
    for role in sorted({p.role for p in job_plan.services}):
        out += [
            f"{role}.server.host=0.0.0.0",
            f"{role}.server.port={PORTS[role]}",
            f"{role}.server.tls_cert={TLS_DIR}/tls.crt",
            f"{role}.server.tls_key={TLS_DIR}/tls.key",
        ]
    addresses = {
        p.name: f"{service_host(p)}:{PORTS[p.role] + p.port_offset}" for p in job_plan.services
    }
    out += job_plan.address_overrides(addresses)
    replicas = [service_host(p) for p in job_plan.services if p.role == "rollout"]
    out += [
        f"coordinator.channel.tls_ca={TLS_DIR}/ca.crt",
        f"weight_sync.allowed_hosts=[{','.join(replicas)}]",
        f"learner.checkpoint_dir={RUNS}",
        f"deploy.run_root={RUNS}",
    ]
    return out


def render_overlay(
    config: str | Path, overrides: Sequence[str], out_dir: Path, name: str = ""
) -> JobConfig:
    """Writes the overlay of ``config`` (with ``overrides``) into ``out_dir`` and returns the
    job it runs (the config with the cluster's settings). ValueError for a job the base
    cannot run (an offline preference job)."""
    job = load_job_config(config, overrides)
    job_plan = plan(job)
    if job_plan.main.role == "tinker":
        return _tinker_overlay(config, overrides, out_dir, name)
    if job_plan.main.role != "coordinator":
        raise ValueError(
            f"a {job_plan.main.role} job ({ONE_PROCESS_JOBS[job_plan.main.role]} is set) runs "
            "with deploy/launch.sh; "
            "the Kubernetes bases run RL jobs and the Tinker-compatible service"
        )
    cluster = _write_job(config, [*overrides, *cluster_overrides(job_plan)], out_dir)
    kustomization = _kustomization(BASE, "hybridflow-job", out_dir, name)
    for process in job_plan.services:
        if process.role == "rollout" and process.port_offset > 0:
            path = out_dir / f"rollout-{process.port_offset}.yaml"
            path.write_text(_replica_manifest(process.port_offset))
            kustomization["resources"].append(path.name)
    kustomization["patches"] = [{"path": "learner.yaml"}]
    if "environment" in job_plan.names():
        kustomization["components"] = [os.path.relpath(COMPONENTS / "environment", out_dir)]
    learner = job_plan.by_name("learner")
    on_gpu = job.learner.topology.device == "cuda"
    (out_dir / "learner.yaml").write_text(yaml.safe_dump(_learner_patch(learner, on_gpu)))
    if job.rollout.device == "cuda":
        (out_dir / "rollout-gpus.yaml").write_text(
            yaml.safe_dump_all(
                _replica_gpu_patch(p) for p in job_plan.services if p.role == "rollout"
            )
        )
        kustomization["patches"].append({"path": "rollout-gpus.yaml"})
    _write_kustomization(kustomization, config, out_dir)
    return cluster


def _tinker_overlay(
    config: str | Path, overrides: Sequence[str], out_dir: Path, name: str
) -> JobConfig:
    """A Tinker-compatible service's overlay: ``deploy/k8s/tinker`` (its one pod) with the
    job's config in cluster settings (``TINKER_CLUSTER``: every interface, the pod's port,
    TLS and the keys from their Secrets)."""
    cluster = _write_job(config, [*overrides, *TINKER_CLUSTER], out_dir)
    kustomization = _kustomization(TINKER_BASE, "hybridflow-tinker-job", out_dir, name)
    _write_kustomization(kustomization, config, out_dir)
    return cluster


def _write_job(config: str | Path, overrides: Sequence[str], out_dir: Path) -> JobConfig:
    """The job with the cluster's ``overrides``, written as the overlay's ``job.yaml``."""
    from hybridflow.config.loader import dump_yaml

    cluster = load_job_config(config, list(overrides))
    out_dir.mkdir(parents=True, exist_ok=True)
    dump_yaml(cluster, out_dir / "job.yaml")
    return cluster


def _kustomization(base: Path, config_map: str, out_dir: Path, name: str) -> dict[str, Any]:
    """An overlay of ``base`` whose ``job.yaml`` replaces the ConfigMap ``config_map``."""
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base, out_dir)],
        "labels": [{"pairs": {"hybridflow/overlay": name or out_dir.name}}],
        "configMapGenerator": [{"name": config_map, "behavior": "replace", "files": ["job.yaml"]}],
    }


def _write_kustomization(kustomization: dict[str, Any], config: str | Path, out_dir: Path) -> None:
    header = (
        f"# Rendered by python -m hybridflow.deploy.k8s from {config}; kubectl apply -k {out_dir}\n"
    )
    (out_dir / "kustomization.yaml").write_text(
        header + yaml.safe_dump(kustomization, sort_keys=False)
    )


def _replica_manifest(index: int) -> str:
    """Replica ``index``'s Deployment and Service: the base's replica 0 with its name, its
    ``--replica-index`` and its port."""
    text = (BASE / "rollout-0.yaml").read_text()
    port = PORTS["rollout"]
    text = text.replace("hybridflow-rollout-0", f"hybridflow-rollout-{index}")
    text = text.replace("--replica-index=0", f"--replica-index={index}")
    text = text.replace(f"localhost:{port}", f"localhost:{port + index}")
    text = text.replace(f"containerPort: {port}", f"containerPort: {port + index}")
    text = text.replace(f"port: {port}", f"port: {port + index}")
    return text


def _learner_patch(learner: Process, on_gpu: bool) -> dict[str, Any]:
    """The learner StatefulSet's pods (torchrun nodes) and ranks per pod (and a GPU each)."""
    container: dict[str, Any] = {
        "name": "learner",
        "env": [
            {"name": "NNODES", "value": str(learner.num_nodes)},
            {"name": "NPROC_PER_NODE", "value": str(learner.num_ranks)},
        ],
    }
    if on_gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": learner.num_ranks}}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "hybridflow-learner"},
        "spec": {"replicas": learner.num_nodes, "template": {"spec": {"containers": [container]}}},
    }


def _replica_gpu_patch(replica: Process) -> dict[str, Any]:
    container = {"name": "rollout", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": service_host(replica)},
        "spec": {"template": {"spec": {"containers": [container]}}},
    }


def main(argv: list[str] | None = None) -> int:
    from hybridflow.config.loader import ConfigError
    from hybridflow.utils.config_args import add_config_args

    parser = argparse.ArgumentParser(
        prog="python -m hybridflow.deploy.k8s",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(parser, "job YAML", "rollout.replicas=2")
    parser.add_argument("--out", required=True, help="the overlay's directory (created)")
    args = parser.parse_args(argv)
    if not args.config:
        parser.error("--config is required")
    try:
        render_overlay(args.config, args.set, Path(args.out))
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: kubectl apply -k {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
