"""A Slurm plan's steps and their printed form: what the planner (``slurm``) writes and the
runner (``slurm_job``) reads. Plain data; knows nothing of the job config or of Slurm itself.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Step:
    """One command of the plan: what runs, on which node, listening where (if a service)."""

    name: str
    node: str
    command: list[str]
    address: str = ""


def format_plan(steps: Sequence[Step]) -> str:
    lines = []
    for step in steps:
        where = f" -> {step.address}" if step.address else ""
        lines.append(f"{step.name} on {step.node}{where}: {shlex.join(step.command)}")
    return "\n".join(lines)
