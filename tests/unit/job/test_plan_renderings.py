"""A job is written down once: every shipped config's plan (``hybridflow.job.plan``) is what
the local launcher starts and what the Slurm planner places, process for process and
setting for setting (module, own arguments, ranks, nodes, devices, ports); each Kubernetes
overlay runs the plan of the job it ships, and every shipped config renders as an overlay
(``python -m hybridflow.deploy.k8s``) that runs its plan.

Each rendering is read back from what it would run: the launcher's command lines (started
with a python that only prints its arguments), the Slurm steps' command lines, and the
containers of the rendered manifests."""

from __future__ import annotations

import shlex
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hybridflow.deploy.k8s import PORTS as K8S_PORTS
from hybridflow.deploy.k8s import render_overlay
from hybridflow.deploy.launch import coordinator_command
from hybridflow.deploy.launcher import ServiceGroup
from hybridflow.deploy.slurm import plan_job
from hybridflow.job.plan import ONE_PROCESS_JOBS, JobPlan, plan
from hybridflow.job_config import JobConfig, load_job_config
from tests.unit.deploy.test_k8s_manifests import (
    LEARNER_NODES,
    OVERLAYS,
    SCHEMA_VERSIONS,
    containers,
    job_config,
    kubectl,
    render,
)

REPO = Path(__file__).resolve().parents[3]
SHIPPED = sorted((REPO / "deploy" / "configs").glob("*.yaml"))
ONE_PROCESS = {  # shipped configs of one-process jobs -> the module they run
    path: plan(load_job_config(path)).main.module
    for path in SHIPPED
    if plan(load_job_config(path)).main.role in ONE_PROCESS_JOBS
}
RL_CONFIGS = [path for path in SHIPPED if path not in ONE_PROCESS]
NODES = ["n0", "n1", "n2"]
JOB_FLAGS = ("--resume", "--addresses-from-stdin")
JOB_ARGS = ("--config", "--set", "--port-file", "--run-dir", *JOB_FLAGS)
"""Arguments every process of a job gets (or the launcher adds), not its own."""


@dataclass(frozen=True)
class Started:
    """What a rendering starts for one process, as read back from its command line."""

    name: str
    module: str
    args: tuple[str, ...]
    num_ranks: int
    num_nodes: int
    devices: str = ""
    port: int | None = None
    """The port it is told to serve on (Slurm, Kubernetes); None where the OS picks."""


def read_command(name: str, tokens: list[str], devices: str = "") -> Started:
    """The process a command line starts: the module after the last ``-m`` (torchrun's ranks
    and nodes read from its flags), its own arguments up to the job's, and the port a
    ``--set <role>.server.port=`` gives it."""
    flags = dict(t.removeprefix("--").split("=", 1) for t in tokens if t.startswith("--n"))
    torchrun = "torch.distributed.run" in tokens
    start = len(tokens) - 1 - tokens[::-1].index("-m")
    module, rest = tokens[start + 1], tokens[start + 2 :]
    own: list[str] = []
    tokens_left = iter(rest)
    for token in tokens_left:
        key = token.split("=", 1)[0]
        if key not in JOB_ARGS:
            own.extend(token.split("=", 1) if token.startswith("--") else [token])
        elif "=" not in token and key not in JOB_FLAGS:
            next(tokens_left)  # the job argument's value
    port = None
    for token in rest:
        if token.removeprefix("--set=").startswith(f"{role_of(name)}.server.port="):
            port = int(token.rpartition("=")[2])
    return Started(
        name,
        module,
        tuple(own),
        int(flags.get("nproc-per-node", 1)) if torchrun else 1,
        int(flags.get("nnodes", 1)) if torchrun else 1,
        devices,
        port,
    )


def role_of(name: str) -> str:
    return name.rstrip("0123456789")


def expected(job_plan: JobPlan, cluster: bool) -> set[Started]:
    """What the plan says each process is; ``cluster``: with the ports a cluster gives."""
    return {
        Started(
            p.name,
            p.module,
            p.args,
            p.num_ranks,
            p.num_nodes,
            p.devices,
            p.cluster_port() - p.port_offset if cluster and p.serves else None,
        )
        for p in job_plan.processes
    }


def launcher_started(config: Path, job: JobConfig, tmp_path: Path) -> set[Started]:
    """The services ``deploy/launch.sh`` starts (with a python that prints its arguments)
    and the coordinator command it runs beside them."""
    fake = tmp_path / "fake-python"
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    group = ServiceGroup(job, str(config), [], tmp_path / "run", python=str(fake))
    try:
        group.start()
        for proc in group.processes:
            proc.popen.wait(timeout=60)
        started = {
            read_command(p.name, ["py", *shlex.split(p.log_path.read_text())], p.devices)
            for p in group.processes
        }
    finally:
        group.stop(grace_s=5)
    coordinator = coordinator_command(job, str(config), [], tmp_path / "run", resume=False)
    return started | {read_command("coordinator", coordinator)}


def slurm_started(config: Path, job: JobConfig, learner_nodes: int) -> set[Started]:
    """The processes of the Slurm steps (a learner spanning nodes is one process), each
    read from the command after its ``slurm_step`` shim."""
    started = set()
    for step in plan_job(NODES, job, ["--config", str(config)], learner_nodes=learner_nodes):
        command = step.command
        if "--" in command:  # a service step: srun ... slurm_step ... -- [env VAR=..] python ..
            command = command[command.index("--") + 1 :]
        devices = ""
        if command[0] == "env":
            devices = command[1].removeprefix("CUDA_VISIBLE_DEVICES=")
            command = command[2:]
        name = "learner" if step.name.startswith("learner") else step.name
        started.add(read_command(name, command, devices))
    return started


@pytest.mark.parametrize("config", RL_CONFIGS, ids=lambda p: p.stem)
def test_the_launcher_and_slurm_start_the_plan_of_every_shipped_config(config, tmp_path):
    job = load_job_config(config)
    job_plan = plan(job)
    assert launcher_started(config, job, tmp_path) == expected(job_plan, cluster=False)
    assert slurm_started(config, job, learner_nodes=1) == expected(job_plan, cluster=True)


@pytest.mark.parametrize("config", RL_CONFIGS, ids=lambda p: p.stem)
def test_a_learner_across_two_slurm_nodes_is_the_plans_learner_on_two_nodes(config):
    job = load_job_config(config)
    (learner,) = {s for s in slurm_started(config, job, learner_nodes=2) if s.name == "learner"}
    (planned,) = {s for s in expected(plan(job), cluster=True) if s.name == "learner"}
    assert learner == Started(**{**planned.__dict__, "num_nodes": 2})


def test_every_shipped_multi_turn_config_plans_its_environment_service():
    multi_turn = [c for c in RL_CONFIGS if load_job_config(c).environment.enabled]
    assert multi_turn, "no shipped config runs an environment service"
    for config in multi_turn:
        assert "environment" in plan(load_job_config(config)).names()


def test_one_process_jobs_are_their_one_process_on_slurm_or_refused_by_name(tmp_path):
    """The preference job runs with deploy/launch.sh only; the Tinker-compatible service is
    the Slurm plan's one step, on every interface of the first node with TLS (the user's loop
    dials it from elsewhere), refused without TLS or a fixed port; on Kubernetes its overlay
    (tests/unit/deploy/test_k8s_tinker.py)."""
    assert sorted(ONE_PROCESS.values()) == ["hybridflow.main.tinker", "hybridflow.preference"]
    for config, module in ONE_PROCESS.items():
        job = load_job_config(config)
        job_plan = plan(job)
        assert job_plan.services == () and job_plan.main.module == module
        if job_plan.main.role == "preference":
            with pytest.raises(ValueError, match="runs with deploy/launch.sh"):
                plan_job(NODES, job, [])
            with pytest.raises(ValueError, match="runs with deploy/launch.sh"):
                render_overlay(config, [], tmp_path / "preference")
            continue
        assert plan(render_overlay(config, [], tmp_path / "tinker")).main.module == module
        with pytest.raises(ValueError, match="set tinker.tls_cert and tinker.tls_key"):
            plan_job(NODES, job, [])
        tls = ["tinker.tls_cert=/c.pem", "tinker.tls_key=/k.pem"]
        with pytest.raises(ValueError, match="needs a fixed port"):
            plan_job(NODES, load_job_config(config, [*tls, "tinker.port=0"]), [])
        args = ["--config", str(config), "--set", tls[0], "--set", tls[1]]
        (step,) = plan_job(NODES, load_job_config(config, tls), args, run_dir=Path("/r"))
        assert (step.name, step.node, step.address) == ("tinker", "n0", "n0:8000")
        assert step.command == [
            "python", "-m", module, "--run-dir", "/r", *args, "--set", "tinker.host=0.0.0.0"
        ]  # fmt: skip


def k8s_started(objects: list[dict[str, Any]]) -> set[Started]:
    """The processes of the rendered manifests: a container's command and args (the
    learner's shell line with the pod's variables put in; one StatefulSet pod per node)."""
    started = set()
    for obj in objects:
        if "template" not in obj.get("spec", {}):
            continue
        (container,) = containers([obj])
        env = {e["name"]: e.get("value", "") for e in container["env"]}
        tokens = [*container["command"], *container.get("args", [])]
        if tokens[:2] == ["sh", "-c"]:
            line = tokens[2].removeprefix("exec ")
            for key, value in env.items():
                line = line.replace(f'"${key}"', value)
            tokens = shlex.split(line)
        name = obj["metadata"]["name"].removeprefix("hybridflow-").replace("-", "")
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        read = read_command(name, tokens)
        started.add(Started(**{**read.__dict__, "port": ports.get("grpc")}))
    return started


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_kubernetes_overlay_runs_the_plan_of_its_job(overlay, tmp_path):
    """Kustomize stays the source of the manifests (patches, probes and volumes are
    Kubernetes' own); what they start is checked against the plan of the job they ship.
    Devices are Kubernetes' to give (``nvidia.com/gpu`` limits), not CUDA_VISIBLE_DEVICES;
    the nodes the learner spans are the overlay's choice (its StatefulSet's replicas), as
    they are Slurm's (``--learner-nodes``)."""
    objects = render(overlay)
    job_plan = plan(job_config(objects, tmp_path))
    planned = set()
    for started in expected(job_plan, cluster=True):
        process = job_plan.by_name(started.name)
        port = started.port and started.port + process.port_offset  # a pod's own port
        nodes = LEARNER_NODES[overlay] if process.role == "learner" else started.num_nodes
        planned.add(
            Started(**{**started.__dict__, "devices": "", "port": port, "num_nodes": nodes})
        )
    assert k8s_started(objects) == planned


def render_dir(directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(directory)], check=True, capture_output=True, text=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.mark.parametrize(
    ("config", "overrides"),
    [
        *[(c, ()) for c in RL_CONFIGS],
        (REPO / "deploy/configs/quickstart.yaml", ("rollout.replicas=3",)),
    ],
    ids=lambda v: v.stem if isinstance(v, Path) else ",".join(v) or "as-shipped",
)
def test_every_shipped_config_renders_as_a_kubernetes_overlay_of_its_plan(
    config, overrides, tmp_path
):
    """``python -m hybridflow.deploy.k8s`` renders the plan of any config as an overlay of
    the base: the manifests start what the plan lists (replicas past the first copied from
    replica 0, each on its own port), every object validates against the Kubernetes schema,
    and the job they read is the config with only the cluster's settings changed."""
    job = load_job_config(config, overrides)
    cluster = render_overlay(config, overrides, tmp_path / "overlay")
    objects = render_dir(tmp_path / "overlay")
    planned = {
        Started(
            **{
                **s.__dict__,
                "devices": "",
                "port": s.port
                and K8S_PORTS[role_of(s.name)] + plan(job).by_name(s.name).port_offset,
            }
        )
        for s in expected(plan(job), cluster=True)
    }
    assert k8s_started(objects) == planned
    assert job_config(objects, tmp_path) == cluster  # the ConfigMap is the rendered job
    for obj in objects:
        kubernetes_validate.validate(obj, SCHEMA_VERSIONS[-1], strict=True)
    for section in ("rollout", "reward", "environment", "learner", "coordinator"):
        ours, theirs = getattr(cluster, section), getattr(job, section)
        for name in ("server", "rollout_addresses", "reward_address", "learner_address"):
            if hasattr(theirs, name):
                setattr(ours, name, getattr(theirs, name))
        for name in ("environment_address", "channel", "checkpoint_dir"):
            if hasattr(theirs, name):
                setattr(ours, name, getattr(theirs, name))
        assert ours == theirs, section
