"""One ``deploy/launch.sh`` run per benchmark variant, into ``<results>/<variant>/``, and its
metrics: what the learning-curve benchmarks (learner_memory/run_precision.py,
multi_turn/run_learning.py) share."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from benchmarks.common.figures import read_steps

REPO = Path(__file__).resolve().parents[2]


def launch_variant(name: str, config: str, overrides: dict[str, str], out: Path) -> None:
    """``deploy/launch.sh --config config`` with ``overrides``, its run dir under
    ``out/name`` and its output in ``out/name.log``; SystemExit if the launch fails."""
    sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    cmd = ["deploy/launch.sh", "--config", config, "--set", f"deploy.run_root={out / name}", *sets]
    with (out / f"{name}.log").open("w") as log:
        done = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name}: deploy/launch.sh exited {done.returncode}; see {name}.log")


def variant_metrics(out: Path, name: str) -> list[dict[str, Any]]:
    """The variant's metrics.jsonl rows (its newest run dir under ``out/name``)."""
    found = sorted((out / name).glob("*/metrics.jsonl"))
    if not found:
        raise SystemExit(f"{name}: no metrics.jsonl under {out / name}")
    return read_steps(found[-1])
