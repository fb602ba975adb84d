"""Places a job's plan (``hybridflow.job.plan``) on a Slurm allocation and runs it (behind
deploy/slurm/hybridflow.sbatch).

The placement: the learner's nodes on the allocation's first ``--learner-nodes`` nodes (one
``srun`` step per node; more than one rank or node runs torchrun, rendezvous at the first
node), the rollout replicas round-robin on the next nodes, the reward service (and the
environment service, when the plan has one) on the last node, the coordinator in the batch
step (the first node) pointed at them all with ``--set`` overrides (a Tinker-compatible
service's plan is that one process, in the batch step: ``_tinker_step``). Services bind 0.0.0.0 on
fixed ports (a port the config leaves at 0 gets the plan's ``CLUSTER_PORTS``) and are
dialled at their node's ``NodeAddr`` (``slurm_allocation``); TLS comes from the config, the
token from ``HYBRIDFLOW_TOKEN`` or the run dir's token file (srun passes the environment
on). Each service step runs under ``slurm_step``, which holds Slurm's SIGTERM until the
coordinator has saved; ``slurm_job`` runs the plan and routes the signals.

``--dry-run`` prints the steps and runs nothing; a real run prints the same steps and writes
them to ``<run dir>/slurm/plan.txt``. Knows the plan and the job config's ports, not the
services' internals; the coordinator waits for the services' health itself.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from hybridflow.deploy.slurm_plan import Step, format_plan
from hybridflow.job.plan import ONE_PROCESS_JOBS, Process, plan, python_command
from hybridflow.job_config import JobConfig, load_job_config

RENDEZVOUS_PORT = 29500
SLURM_ORDER = ("learner", "rollout", "reward", "environment")
"""The order of the services' steps: the learner first, on the allocation's first nodes."""

_BRACKET = re.compile(r"\[([^\]]*)\]")


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list as names, in order: ``gpu[01-03,07],cpu5`` ->
    gpu01 gpu02 gpu03 gpu07 cpu5. Ranges keep the start's zero padding; several bracket groups
    in one name expand as a product (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2)."""
    names: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        names.extend(_expand_item(item))
    return names


def _split_top_level(text: str) -> list[str]:
    """Splits on commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in node list {text!r}")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in node list {text!r}")
    items.append(text[start:])
    if any(not item for item in items):
        raise ValueError(f"empty name in node list {text!r}")
    return items


def _expand_item(item: str) -> list[str]:
    match = _BRACKET.search(item)
    if match is None:
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    return [
        f"{head}{suffix}{rest}"
        for suffix in _expand_ranges(match.group(1), item)
        for rest in _expand_item(tail)
    ]


def _expand_ranges(ranges: str, item: str) -> list[str]:
    out = []
    for part in ranges.split(","):
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"bad range {part!r} in node list item {item!r}")
        if not sep:
            out.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"descending range {part!r} in node list item {item!r}")
        out.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return out


def plan_job(
    nodes: Sequence[str],
    job: JobConfig,
    config_args: Sequence[str],
    learner_nodes: int = 1,
    python: str = "python",
    addresses: Mapping[str, str] | None = None,
    run_dir: Path = Path("runs/slurm"),
    resume: bool = False,
) -> list[Step]:
    """The job's plan (``hybridflow.job.plan``) placed on ``nodes`` as srun steps, then the
    coordinator (run on the batch host, ``nodes[0]``). ``config_args``: ``--config``/``--set``
    arguments every process gets; ``addresses``: NodeName -> the address the others dial
    (default: the names); ``run_dir``: the run's directory, on a filesystem every node sees
    (each step logs to ``logs/<step>.log`` there); ``resume``: the coordinator continues
    from the run's newest checkpoint."""
    if not nodes:
        raise ValueError("the allocation has no nodes")
    if not 1 <= learner_nodes <= len(nodes):
        raise ValueError(f"--learner-nodes must be in [1, {len(nodes)}], got {learner_nodes}")
    job_plan = plan(job)
    if job_plan.main.role == "tinker":
        return [_tinker_step(nodes[0], job, config_args, python, addresses, run_dir)]
    if job_plan.main.role != "coordinator":
        raise ValueError(
            f"a {job_plan.main.role} job ({ONE_PROCESS_JOBS[job_plan.main.role]} is set) runs "
            "with deploy/launch.sh; "
            "the Slurm launcher runs RL jobs and the Tinker-compatible service"
        )
    addr = {node: node for node in nodes} if addresses is None else dict(addresses)
    placed = _place(list(nodes), learner_nodes, job_plan.services)
    # The learner sends weights only to the replicas' hosts; a replica joins only the
    # torch.distributed store on node 0 (weight_sync.transport=dist, e.g. NCCL on GPUs).
    replica_hosts = {addr[node] for spec, node in placed if spec.role == "rollout"}
    allowed = sorted(replica_hosts | {addr[nodes[0]]})
    shared = [
        *config_args,
        "--set",
        f"weight_sync.allowed_hosts=[{','.join(allowed)}]",
        "--set",
        f"weight_sync.store_host={addr[nodes[0]]}",
    ]
    if not job.learner.checkpoint_dir:  # the only place checkpoint RPCs may write
        shared += ["--set", f"learner.checkpoint_dir={run_dir / 'checkpoints'}"]
    exit_file, stop_file = run_dir / "slurm" / "coordinator.exit", run_dir / "slurm" / "stop"

    def srun(node: str, name: str, stop: str = "process") -> list[str]:
        """One task on ``node``, sharing the allocation with the other steps, logging to the
        run dir, under the shim that holds Slurm's SIGTERM and stops the service as ``stop``
        says (``slurm_step``)."""
        return [
            "srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap",
            f"--output={run_dir / 'logs' / name}.log",
            python, "-m", "hybridflow.deploy.slurm_step",
            f"--exit-file={exit_file}", f"--stop-file={stop_file}", f"--stop={stop}", "--",
        ]  # fmt: skip

    steps, served = [], {}
    for spec, node in sorted(placed, key=lambda placed: SLURM_ORDER.index(placed[0].role)):
        # A service binds every interface on its fixed port (a replica adds its index).
        serve = [*shared, "--set", f"{spec.role}.server.host=0.0.0.0"]
        serve += ["--set", f"{spec.port_key}={spec.cluster_port() - spec.port_offset}"]
        if spec.role != "learner":
            command = [*srun(node, spec.name), *_visible(spec.devices)]
            command += [*python_command(python, spec, job.learner), *serve]
            served[spec.name] = f"{addr[node]}:{spec.cluster_port()}"
            steps.append(Step(spec.name, node, command, served[spec.name]))
            continue
        for rank in range(learner_nodes):
            steps.append(
                _learner_step(spec, rank, nodes, learner_nodes, addr, job, python, srun, serve)
            )
        served[spec.name] = steps[-learner_nodes].address
    coordinator = [python, "-m", job_plan.main.module, *job_plan.main.args]
    coordinator += ["--run-dir", str(run_dir), *(["--resume"] if resume else []), *shared]
    for override in job_plan.address_overrides(served):
        coordinator += ["--set", override]
    steps.append(Step(job_plan.main.name, nodes[0], coordinator))
    return steps


def _tinker_step(
    node: str,
    job: JobConfig,
    config_args: Sequence[str],
    python: str,
    addresses: Mapping[str, str] | None,
    run_dir: Path,
) -> Step:
    """The Tinker-compatible service alone, in the batch step on ``node``: the user's loop
    runs elsewhere (a login node, a laptop), so it binds every interface on its port (the
    config's, 8000 by default), and that needs TLS. Its state (``<run dir>/tinker``) is what
    a requeued or resubmitted job serves on from where it was: no ``--resume`` to pass."""
    cfg = job.tinker
    if not (cfg.tls_cert and cfg.tls_key):
        raise ValueError(
            "the Tinker-compatible service on Slurm serves off its node: set tinker.tls_cert "
            "and tinker.tls_key (a certificate naming the node's address, docs/tinker.md)"
        )
    if cfg.port == 0:
        raise ValueError("tinker.port is 0: on Slurm the service needs a fixed port to be found")
    address = f"{(addresses or {}).get(node, node)}:{cfg.port}"
    command = [python, "-m", "hybridflow.main.tinker", "--run-dir", str(run_dir), *config_args]
    return Step("tinker", node, [*command, "--set", "tinker.host=0.0.0.0"], address)


def _place(
    nodes: list[str], learner_nodes: int, services: Sequence[Process]
) -> list[tuple[Process, str]]:
    """Each service with its node: the learner on the first ``learner_nodes`` (listed with
    the first), the rollout replicas round-robin on the next nodes, the reward and the
    environment service on the last node (with the replicas when no other is left)."""
    service_nodes = nodes[learner_nodes:] or [nodes[-1]]
    rollout_nodes = service_nodes[:-1] if len(service_nodes) > 1 else service_nodes
    placed = []
    for spec in services:
        if spec.role == "learner":
            placed.append((spec, nodes[0]))
        elif spec.role == "rollout":
            placed.append((spec, rollout_nodes[spec.port_offset % len(rollout_nodes)]))
        else:
            placed.append((spec, service_nodes[-1]))
    return placed


def _learner_step(
    spec: Process,
    rank: int,
    nodes: Sequence[str],
    learner_nodes: int,
    addr: Mapping[str, str],
    job: JobConfig,
    python: str,
    srun: Callable[[str, str, str], list[str]],
    serve: Sequence[str],
) -> Step:
    """The learner's step on its ``rank``-th node (torchrun across ``learner_nodes`` nodes,
    rendezvous at the first; rank 0 serves gRPC and gets the stop, relaying it to the
    others). ``srun``: a step's prefix on a node; ``serve``: the service's overrides."""
    node = nodes[rank]
    topology = replace(
        job.learner.topology,
        nnodes=learner_nodes,
        node_rank=rank,
        rdzv_endpoint=f"{addr[nodes[0]]}:{RENDEZVOUS_PORT}",
        local_addr=addr[node],
    )
    learner = replace(job.learner, topology=topology)
    spec = replace(spec, num_nodes=learner_nodes)
    single = spec.num_ranks <= 1 and learner_nodes <= 1
    stop = ("process" if single else "children") if rank == 0 else "wait"
    command = [*srun(node, f"learner{rank}", stop), *_visible(spec.devices)]
    command += [*python_command(python, spec, learner), *serve]
    for key in ("nnodes", "node_rank", "rdzv_endpoint", "local_addr") if learner_nodes > 1 else ():
        command += ["--set", f"learner.topology.{key}={getattr(topology, key)}"]
    address = f"{addr[node]}:{spec.cluster_port()}" if rank == 0 else ""
    return Step(f"learner{rank}", node, command, address)


def _visible(devices: str) -> list[str]:
    """The devices a step's service sees (``rollout.devices``, ``learner.topology.devices``),
    as deploy/launch.sh gives them; nothing when the config names none."""
    return ["env", f"CUDA_VISIBLE_DEVICES={devices}"] if devices else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hybridflow-slurm", description=__doc__)
    parser.add_argument("--config", help="job YAML")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--nodelist",
        default=os.environ.get("SLURM_JOB_NODELIST", ""),
        help="Slurm node list (default: $SLURM_JOB_NODELIST)",
    )
    parser.add_argument("--learner-nodes", type=int, default=1, help="torchrun nodes")
    parser.add_argument("--python", default=sys.executable, help="the python on every node")
    parser.add_argument(
        "--run-dir",
        help="the run's directory, seen by every node (default: "
        "<deploy.run_root>/slurm-<job id>, the same across requeues)",
    )
    parser.add_argument(
        "--resume",
        choices=["auto"],
        help="auto: continue the run in the run dir when an earlier start left one (a "
        "requeued job, or a resubmission with the same --run-dir), else start afresh",
    )
    parser.add_argument(
        "--sweep",
        metavar="KEY=V0,V1,...",
        help="a job array's setting: array task i runs with --set KEY=Vi (sbatch --array=0-N)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = parser.parse_args(argv)

    from hybridflow.config.loader import ConfigError
    from hybridflow.deploy.slurm_allocation import (
        default_run_dir,
        has_earlier_start,
        node_addresses,
        sweep_override,
    )

    try:
        if args.sweep:
            args.set.append(sweep_override(args.sweep, os.environ))
        job = load_job_config(args.config, args.set)
        nodes = expand_nodelist(args.nodelist)
        addresses = node_addresses(nodes)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir or default_run_dir(job.deploy.run_root, os.environ)).absolute()
    checkpoints = Path(job.learner.checkpoint_dir or run_dir / "checkpoints")
    resume = args.resume == "auto" and has_earlier_start(run_dir, checkpoints)
    config_args = ["--config", args.config] if args.config else []
    for override in args.set:
        config_args += ["--set", override]
    try:
        steps = plan_job(
            nodes, job, config_args, args.learner_nodes, args.python, addresses, run_dir, resume
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    print(
        f"slurm: run dir {run_dir} ({'resuming' if resume else 'fresh start'}, "
        f"restart count {restarts})",
        file=sys.stderr,
    )
    print(format_plan(steps), flush=True)
    if steps[-1].name == "tinker" and len(nodes) > 1:
        print(f"slurm: the Tinker-compatible service runs on {nodes[0]}; "
              f"{len(nodes) - 1} more node(s) stay idle (sbatch --nodes=1)", file=sys.stderr)  # fmt: skip
    if args.dry_run:
        return 0
    return _run(steps, job, run_dir)


def _run(steps: list[Step], job: JobConfig, run_dir: Path) -> int:
    """Claims the run dir (its mode, its lock, its token) and runs the plan there."""
    from hybridflow.deploy.run_dir_mode import prepare_run_dir
    from hybridflow.deploy.run_lock import RunDirBusy, lock_run_dir
    from hybridflow.deploy.slurm_job import run_plan
    from hybridflow.rpc.token import export_run_token

    prepare_run_dir(run_dir, job.deploy.group_readable)  # and the umask every step inherits
    try:
        lock = lock_run_dir(run_dir)  # held for the job; the coordinator (a child) goes on
        export_run_token(run_dir, os.environ)  # unless HYBRIDFLOW_TOKEN is set: srun passes it
    except (RunDirBusy, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        return run_plan(steps, run_dir)
    finally:
        lock.release()


if __name__ == "__main__":
    sys.exit(main())
