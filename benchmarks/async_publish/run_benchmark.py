"""Async publish suite: seconds per async step against the learner's own compute per step,
with each weight publish beside the next train step (``overlap``) and on the step's critical
path (``serial``, ``coordinator.overlap_publish=false``), in one run.

    python benchmarks/async_publish/run_benchmark.py        # 200 steps, 2 variants x 3 runs

results/YYYYMMDD_HHMMSS/summary.json: per variant the shared runner's figures (mean_step_s,
mean_learner_compute_s, mean_sync_s: the step's own publish time, mean_publish_wall_s: a
publish's whole wall time); ``ratios``: each variant's step over learner compute (1.0: the
step costs only the learner's compute) and serial over overlap seconds per step. Run nothing
else on the machine meanwhile.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common.runner import main  # noqa: E402

VARIANTS = ("overlap", "serial")


def ratios(figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in VARIANTS:
        fig = figures.get(name)
        if fig and fig.get("mean_learner_compute_s"):
            out[f"{name}_step_over_learner_compute"] = (
                fig["mean_step_s"] / fig["mean_learner_compute_s"]
            )
    overlap, serial = figures.get("overlap"), figures.get("serial")
    if overlap and serial and overlap.get("mean_step_s"):
        out["serial_over_overlap_step_s"] = serial["mean_step_s"] / overlap["mean_step_s"]
    return out


if __name__ == "__main__":
    sys.exit(main("benchmarks/async_publish/config.yaml", ratios))
