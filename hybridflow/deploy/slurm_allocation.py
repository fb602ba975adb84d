"""What the batch step knows of its Slurm allocation: the nodes' addresses, the job's run
directory, whether this start continues an earlier one, and a job array task's setting.

Addresses: a node's ``NodeAddr`` as ``scontrol show node`` reports it (what slurmctld itself
dials; a NodeName need not resolve, or may resolve to another interface). Without
``scontrol`` on PATH (a dry run outside Slurm) the names stand for their addresses, and a
line on stderr says so.

Run directory: ``<deploy.run_root>/slurm-<job id>`` (``slurm-<array job id>_<task id>`` for
a job array's task), the same across requeues of the job, so ``--resume auto`` finds what
the earlier start saved. It must be on a filesystem every node sees.

Job arrays: ``--sweep KEY=V0,V1,...`` gives array task i ``--set KEY=Vi`` (values hold no
comma), each task in its own run directory.

Knows nothing of services or configs beyond the run root it is given.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def node_addresses(nodes: Sequence[str]) -> dict[str, str]:
    """NodeName -> NodeAddr for ``nodes`` (from ``scontrol``; the names themselves without
    it). ValueError naming a node scontrol does not know."""
    if shutil.which("scontrol") is None:
        print("scontrol not found: node names stand for their addresses", file=sys.stderr)
        return {node: node for node in nodes}
    out = subprocess.run(
        ["scontrol", "-o", "show", "node", ",".join(nodes)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        raise ValueError(f"scontrol show node {','.join(nodes)}: {out.stderr.strip()}")
    found = parse_node_addresses(out.stdout)
    missing = [node for node in nodes if node not in found]
    if missing:
        raise ValueError(f"scontrol show node: no NodeAddr for {', '.join(missing)}")
    return {node: found[node] for node in nodes}


def parse_node_addresses(text: str) -> dict[str, str]:
    """``scontrol -o show node`` output (one node a line) as NodeName -> NodeAddr."""
    addresses = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields and fields.get("NodeAddr"):
            addresses[fields["NodeName"]] = fields["NodeAddr"]
    return addresses


def default_run_dir(run_root: str, environ: Mapping[str, str]) -> Path:
    """The job's run directory under ``run_root``: named by the job (array task) id, which a
    requeue keeps; by the time outside Slurm."""
    array_job, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        name = f"slurm-{array_job}_{task}"
    elif environ.get("SLURM_JOB_ID"):
        name = f"slurm-{environ['SLURM_JOB_ID']}"
    else:
        name = f"slurm-{time.strftime('%Y%m%d_%H%M%S')}"
    return Path(run_root) / name


def has_earlier_start(run_dir: Path, checkpoint_root: Path) -> bool:
    """Whether an earlier start of the job got as far as its coordinator (``config.yaml``)
    or a checkpoint. Resuming is right either way: the coordinator continues from the newest
    checkpoint that verifies, or, with none, starts at step 1 with the earlier start's
    records rewound (a fresh start would append to them)."""
    if (run_dir / "config.yaml").is_file():
        return True
    return checkpoint_root.is_dir() and any(checkpoint_root.glob("step_*/coordinator.json"))


def sweep_override(sweep: str, environ: Mapping[str, str]) -> str:
    """A job array's setting for this task: ``KEY=V0,V1,...`` -> ``KEY=V<task id>``.
    ValueError when this is not an array task, or its id indexes no value."""
    key, sep, values = sweep.partition("=")
    if not sep or not key or not values:
        raise ValueError(f"--sweep {sweep!r}: expected KEY=V0,V1,...")
    task = environ.get("SLURM_ARRAY_TASK_ID", "")
    if not task.isdigit():
        raise ValueError(
            "--sweep needs a job array task (sbatch --array=0-N): no SLURM_ARRAY_TASK_ID"
        )
    choices = values.split(",")
    if int(task) >= len(choices):
        raise ValueError(
            f"--sweep {key}: array task {task} has no value ({len(choices)} given: "
            f"--array=0-{len(choices) - 1})"
        )
    return f"{key}={choices[int(task)]}"
