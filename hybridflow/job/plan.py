"""The processes of one job, written down once.

``plan(job)`` lists what a job runs: each service process with its role, the module it
runs, its arguments, the devices it sees, the config key of its port (and the port a
cluster gives it when the config leaves it to the OS), whether a supervisor may restart
it, and the coordinator, which waits for every service's health and is told their
addresses. The local launcher (``deploy/launcher.py``) runs this list; the Slurm planner
(``deploy/slurm.py``) places it on an allocation's nodes; ``deploy/k8s.py`` renders it as a
kustomize overlay of the Kubernetes base; ``tests/unit/job/test_plan_renderings.py`` reads
every shipped config back from all three. A new process is added here, never to three
launchers. ``eval_plan(job)`` is the offline evaluation's share of it (no learner, unless a
train state is evaluated).

Every process has the same health check: the standard gRPC health service on the port it
serves, answering SERVING (``rpc.channel.check_health``; ``deploy.health_probe`` on a
cluster). An offline preference job (``preference.data``) runs one learner-side process and
nothing else.

Pure: reads the job config, starts nothing, imports no torch and no grpc.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hybridflow.job_config import JobConfig

CLUSTER_PORTS = {
    "learner": 50051,
    "reward": 50052,
    "environment": 50053,
    "rollout": 50100,
}
"""Ports on a cluster (Slurm) for a role whose ``<role>.server.port`` is 0; a rollout
replica serves on this base plus its index."""

ADDRESS_KEYS = {
    "learner": "coordinator.learner_address",
    "reward": "coordinator.reward_address",
    "environment": "coordinator.environment_address",
    "rollout": "coordinator.rollout_addresses",
}
"""Where the coordinator is told each role's address (the rollout one takes a list)."""

ONE_PROCESS_JOBS = {"preference": "preference.data", "tinker": "tinker.enabled"}
"""Jobs that are one process of their own (no services, no coordinator), by role, with the
key that makes a job one: deploy/launch.sh runs them; the cluster launchers refuse them."""

RESTARTABLE = frozenset({"rollout", "reward", "environment"})
"""Roles a supervisor starts again on their address when they die: their state is the
coordinator's to resend. A dead learner or coordinator stops the job."""


@dataclass(frozen=True)
class Process:
    """One process of a job, as every launcher starts it."""

    name: str
    """Unique in the job: ``learner``, ``reward``, ``environment``, ``rollout<i>``,
    ``coordinator``, ``preference``, ``tinker``. Logs, port files and Slurm steps are named by it."""
    role: str
    """What it is: ``learner``, ``reward``, ``environment``, ``rollout``, ``coordinator``,
    ``preference``, ``tinker``."""
    module: str
    """What ``python -m`` runs (under torchrun when ``num_ranks`` or ``num_nodes`` > 1)."""
    args: tuple[str, ...] = ()
    """Its own arguments, before the job's ``--config``/``--set``."""
    devices: str = ""
    """``CUDA_VISIBLE_DEVICES`` for it; empty: what the machine gives."""
    num_ranks: int = 1
    """Ranks per node (torchrun ``--nproc-per-node``)."""
    num_nodes: int = 1
    """Nodes its ranks span (torchrun ``--nnodes``); rank 0's node serves."""
    port: int = 0
    """The config's port for it (a replica: the base it adds its index to); 0: the OS picks."""
    port_offset: int = 0
    """Added to ``port`` by the process itself (a rollout replica's index)."""
    restartable: bool = False
    """A supervisor may start it again on the address it had (``RESTARTABLE``)."""
    waits_for: tuple[str, ...] = ()
    """The processes whose health it waits for before its work starts (the coordinator:
    every service)."""

    @property
    def serves(self) -> bool:
        """Whether it serves gRPC (and answers health): every process but the coordinator
        and a preference job."""
        return self.role in ADDRESS_KEYS

    @property
    def port_key(self) -> str:
        """The config key of its port: ``<role>.server.port``."""
        return f"{self.role}.server.port" if self.serves else ""

    @property
    def address_key(self) -> str:
        """The coordinator key its address goes into."""
        return ADDRESS_KEYS.get(self.role, "")

    def cluster_port(self) -> int:
        """The port it serves on a cluster: the config's, or ``CLUSTER_PORTS``, plus its
        offset."""
        return (self.port or CLUSTER_PORTS[self.role]) + self.port_offset

    def restart_pin(self, address: str) -> str:
        """The override that starts it again on ``address`` (host:port): its port key set
        to the port less its own offset (a replica adds its index itself)."""
        _, _, port = address.rpartition(":")
        if not self.restartable:
            raise ValueError(f"{self.name} cannot be restarted")
        if not port.isdigit():
            raise ValueError(f"{self.name} has no address to restart on ({address!r})")
        return f"{self.port_key}={int(port) - self.port_offset}"


@dataclass(frozen=True)
class JobPlan:
    """The services of a job (in the order they start) and the process that drives them
    (the coordinator, or an offline job's only process)."""

    services: tuple[Process, ...]
    main: Process

    @property
    def processes(self) -> tuple[Process, ...]:
        return (*self.services, self.main)

    def by_name(self, name: str) -> Process:
        for process in self.processes:
            if process.name == name:
                return process
        raise KeyError(f"no process {name!r} in the plan (has {self.names()})")

    def names(self) -> list[str]:
        return [p.name for p in self.processes]

    def address_overrides(self, addresses: Mapping[str, str]) -> list[str]:
        """``--set`` overrides that point the coordinator at the services, from each
        service's address by name (replicas in index order)."""
        missing = [p.name for p in self.services if p.name not in addresses]
        if missing:
            raise ValueError(f"no address for {', '.join(missing)}")
        rollouts = [addresses[p.name] for p in self.services if p.role == "rollout"]
        out = [f"{ADDRESS_KEYS['rollout']}=[{','.join(rollouts)}]"]
        out += [
            f"{p.address_key}={addresses[p.name]}" for p in self.services if p.role != "rollout"
        ]
        return out


def plan(job: JobConfig) -> JobPlan:
    """The processes ``job`` runs: for an RL job the reward service, the environment
    service when ``environment.envs`` lists a class, the learner, one rollout process per
    replica, then the coordinator; for an offline preference job or a Tinker-compatible
    service (``tinker.enabled``), that process alone."""
    topology = job.learner.topology
    ranks = topology.nproc_per_node + topology.critic_nproc_per_node
    if job.tinker.enabled:  # the user's own loop drives: the service is the whole job
        return JobPlan((), Process("tinker", "tinker", "hybridflow.main.tinker"))
    if job.preference.data:
        preference = Process(
            "preference",
            "preference",
            "hybridflow.preference",
            devices=topology.visible_devices,
            num_ranks=ranks,
            num_nodes=topology.nnodes,
        )
        return JobPlan((), preference)
    services = [_service("reward", "hybridflow.main.reward", job.reward.server.port)]
    if job.environment.enabled:
        services.append(
            _service("environment", "hybridflow.main.environment", job.environment.server.port)
        )
    services.append(
        Process(
            "learner",
            "learner",
            "hybridflow.main.learner",
            devices=topology.visible_devices,
            num_ranks=ranks,
            num_nodes=topology.nnodes,
            port=job.learner.server.port,
        )
    )
    devices = job.rollout.devices
    for i in range(job.rollout.replicas):
        services.append(
            Process(
                f"rollout{i}",
                "rollout",
                "hybridflow.main.rollout",
                args=("--replica-index", str(i)),
                devices=devices[i] if devices else "",
                port=job.rollout.server.port,
                port_offset=i,
                restartable=True,
            )
        )
    coordinator = Process(
        "coordinator",
        "coordinator",
        "hybridflow.main.coordinator",
        args=("run",),
        waits_for=tuple(p.name for p in services),
    )
    return JobPlan(tuple(services), coordinator)


def eval_plan(job: JobConfig, learner: bool = False) -> JobPlan:
    """The processes an offline evaluation runs (``hybridflow-coordinator eval``): the
    job's services, driven by the evaluating process itself; the learner only with
    ``learner`` (it loads a resumable train state and publishes it to the replicas),
    else the replicas load the evaluated policy from disk."""
    services = tuple(p for p in plan(job).services if learner or p.role != "learner")
    evaluator = Process(
        "evaluator",
        "coordinator",
        "hybridflow.main.coordinator",
        args=("eval",),
        waits_for=tuple(p.name for p in services),
    )
    return JobPlan(services, evaluator)


def _service(role: str, module: str, port: int) -> Process:
    return Process(role, role, module, port=port, restartable=role in RESTARTABLE)


def python_command(python: str, process: Process, learner: Any) -> list[str]:
    """``python -m <module> <args>``, under torchrun when the process has more than one rank
    or node (``learner``: the learner config whose topology places the ranks: this node's
    ``node_rank``, the rendezvous endpoint, the local address)."""
    command = _ranks(python, process.module, process.num_ranks, process.num_nodes, learner.topology)
    return [*command, *process.args]


def ranks_command(python: str, module: str, learner: Any) -> list[str]:
    """``python -m module``, under torchrun when the learner has more than one rank:
    ``learner.topology.nproc_per_node`` actor ranks plus ``critic_nproc_per_node`` critic
    ranks per node, on ``nnodes`` nodes (the learner service and the offline preference job
    run their ranks the same way)."""
    topology = learner.topology
    num_ranks = topology.nproc_per_node + topology.critic_nproc_per_node
    return _ranks(python, module, num_ranks, topology.nnodes, topology)


def _ranks(python: str, module: str, num_ranks: int, num_nodes: int, topology: Any) -> list[str]:
    if num_ranks <= 1 and num_nodes <= 1:
        return [python, "-m", module]
    if num_nodes > 1:  # every node runs this with its own node_rank; node 0 serves
        placement = [
            f"--nnodes={num_nodes}",
            f"--node-rank={topology.node_rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={topology.rdzv_endpoint}",
            *([f"--local-addr={topology.local_addr}"] if topology.local_addr else []),
            # Node 0 serves the rendezvous store: torchrun's own guess (the endpoint names
            # this machine) misses when the host name resolves to another interface.
            *(["--rdzv-conf=is_host=1"] if topology.node_rank == 0 else []),
        ]
    else:
        placement = ["--standalone"]
    return [
        python,
        "-m",
        "hybridflow.deploy.lifeline",  # torchrun itself has no parent-death hook
        "torch.distributed.run",
        *placement,
        f"--nproc-per-node={num_ranks}",
        "-m",
        module,
    ]


def config_args(config_path: str | None, overrides: Sequence[str]) -> list[str]:
    """The ``--config``/``--set`` arguments every process of a job gets."""
    args = ["--config", config_path] if config_path else []
    for override in overrides:
        args += ["--set", override]
    return args
