"""Places a job's services on a Slurm allocation and runs it (behind deploy/slurm/hybridflow.sbatch).

The plan: the learner's torchrun nodes on the allocation's first ``--learner-nodes`` nodes (one
``srun`` step per node, ``--node-rank`` fixed, rendezvous at the first node), the rollout
replicas round-robin on the next nodes, the reward service on the last node, the coordinator
on the batch host (the first node) pointed at them all with ``--set`` overrides. Services bind
0.0.0.0 on fixed ports (a port the config leaves at 0 gets a default below); TLS comes from
the config, the token from ``HYBRIDFLOW_TOKEN`` (srun passes the environment on).

``--dry-run`` prints the plan and runs nothing. Knows the job config's ports and counts, not
the services' internals; the coordinator waits for the services' health itself.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from hybridflow.job_config import JobConfig

DEFAULT_LEARNER_PORT = 50051
DEFAULT_REWARD_PORT = 50052
DEFAULT_ROLLOUT_BASE_PORT = 50100
"""Replica i listens on base + i (the rollout ``__main__`` adds its index)."""
RENDEZVOUS_PORT = 29500

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


@dataclass
class Step:
    """One command of the plan: what runs, on which node, listening where (if a service)."""

    name: str
    node: str
    command: list[str]
    address: str = ""


def plan_job(
    nodes: Sequence[str],
    job: JobConfig,
    config_args: Sequence[str],
    learner_nodes: int = 1,
    python: str = "python",
) -> list[Step]:
    """The services' srun steps, then the coordinator (run on the batch host, ``nodes[0]``).
    ``config_args``: ``--config``/``--set`` arguments every process gets."""
    if not nodes:
        raise ValueError("the allocation has no nodes")
    if not 1 <= learner_nodes <= len(nodes):
        raise ValueError(f"--learner-nodes must be in [1, {len(nodes)}], got {learner_nodes}")
    service_nodes = list(nodes[learner_nodes:]) or [nodes[-1]]
    rollout_nodes = service_nodes[:-1] if len(service_nodes) > 1 else service_nodes
    reward_node = service_nodes[-1]
    learner_port = job.learner.server.port or DEFAULT_LEARNER_PORT
    reward_port = job.reward.server.port or DEFAULT_REWARD_PORT
    rollout_base = job.rollout.server.port or DEFAULT_ROLLOUT_BASE_PORT
    rollouts = [
        (rollout_nodes[i % len(rollout_nodes)], rollout_base + i)
        for i in range(job.rollout.replicas)
    ]
    allowed = sorted({node for node, _ in rollouts})
    shared = [*config_args, "--set", f"weight_sync.allowed_hosts=[{','.join(allowed)}]"]

    def srun(node: str) -> list[str]:
        return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap"]

    def serve(role: str, port: int) -> list[str]:
        return [
            *shared,
            "--set",
            f"{role}.server.host=0.0.0.0",
            "--set",
            f"{role}.server.port={port}",
        ]

    steps = []
    for rank, node in enumerate(nodes[:learner_nodes]):
        torchrun = [
            python, "-m", "torch.distributed.run",
            f"--nnodes={learner_nodes}", f"--node-rank={rank}",
            f"--nproc-per-node={job.learner.topology.num_ranks}",
            f"--master-addr={nodes[0]}", f"--master-port={RENDEZVOUS_PORT}",
        ]  # fmt: skip
        address = f"{node}:{learner_port}" if rank == 0 else ""  # rank 0 serves gRPC
        command = [*srun(node), *torchrun, "-m", "hybridflow.services.learner"]
        steps.append(
            Step(f"learner{rank}", node, [*command, *serve("learner", learner_port)], address)
        )
    for i, (node, port) in enumerate(rollouts):
        command = [
            *srun(node),
            python,
            "-m",
            "hybridflow.services.rollout",
            "--replica-index",
            str(i),
        ]
        # The replica adds its index to the base port itself.
        steps.append(
            Step(f"rollout{i}", node, [*command, *serve("rollout", rollout_base)], f"{node}:{port}")
        )
    reward = [*srun(reward_node), python, "-m", "hybridflow.services.reward"]
    steps.append(
        Step(
            "reward",
            reward_node,
            [*reward, *serve("reward", reward_port)],
            f"{reward_node}:{reward_port}",
        )
    )
    addresses = [
        f"coordinator.rollout_addresses=[{','.join(f'{n}:{p}' for n, p in rollouts)}]",
        f"coordinator.reward_address={reward_node}:{reward_port}",
        f"coordinator.learner_address={nodes[0]}:{learner_port}",
    ]
    coordinator = [python, "-m", "hybridflow.coordinator", "run", *shared]
    for override in addresses:
        coordinator += ["--set", override]
    steps.append(Step("coordinator", nodes[0], coordinator))
    return steps


def format_plan(steps: Sequence[Step]) -> str:
    lines = []
    for step in steps:
        where = f" -> {step.address}" if step.address else ""
        lines.append(f"{step.name} on {step.node}{where}: {shlex.join(step.command)}")
    return "\n".join(lines)


def run_plan(steps: Sequence[Step]) -> int:
    """Starts the services' steps, runs the coordinator to its end, then SIGTERMs the steps
    (srun forwards it to the tasks). Returns the coordinator's exit code."""
    services = [subprocess.Popen(step.command) for step in steps[:-1]]
    try:
        return subprocess.run(steps[-1].command).returncode
    finally:
        for popen in services:
            if popen.poll() is None:
                popen.send_signal(signal.SIGTERM)
        for popen in services:
            popen.wait()


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
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = parser.parse_args(argv)

    from hybridflow.job_config import load_job_config

    job = load_job_config(args.config, args.set)
    config_args = ["--config", args.config] if args.config else []
    for override in args.set:
        config_args += ["--set", override]
    try:
        steps = plan_job(
            expand_nodelist(args.nodelist), job, config_args, args.learner_nodes, args.python
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_plan(steps), flush=True)
    if args.dry_run:
        return 0
    return run_plan(steps)


if __name__ == "__main__":
    sys.exit(main())
