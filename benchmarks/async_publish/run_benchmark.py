"""Async publish suite: seconds per async step against the learner's own compute per step,
with the next step sent while the current one trains and each publish started by the
learner (``ahead``: the default), each weight publish beside the next train step but steps
sent one at a time (``overlap``, ``coordinator.train_ahead=false``), and the publish on the
step's critical path (``serial``, ``coordinator.overlap_publish=false``), in one run.

    python benchmarks/async_publish/run_benchmark.py        # 200 steps, 3 variants x 3 runs

results/YYYYMMDD_HHMMSS/summary.json: per variant the shared runner's figures (mean_step_s,
mean_learner_compute_s, mean_sync_s: the step's own publish time, mean_publish_wall_s: a
publish's whole wall time); ``ratios``: each variant's step over learner compute (1.0: the
step costs only the learner's compute), the same with the wall clock per step (what the
job's own bookkeeping between steps adds too), and serial and overlap over ahead seconds per
step. Run nothing else on the machine meanwhile.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common.runner import main  # noqa: E402

VARIANTS = ("ahead", "overlap", "serial")


def ratios(figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in VARIANTS:
        fig = figures.get(name)
        if fig and fig.get("mean_learner_compute_s"):
            compute = fig["mean_learner_compute_s"]
            out[f"{name}_step_over_learner_compute"] = fig["mean_step_s"] / compute
            if fig.get("steps_timed") and fig.get("wall_s"):
                wall_per_step = fig["wall_s"] / fig["steps_timed"]
                out[f"{name}_wall_over_learner_compute"] = wall_per_step / compute
    for base, other in (("overlap", "serial"), ("ahead", "overlap"), ("ahead", "serial")):
        fast, slow = figures.get(base), figures.get(other)
        if fast and slow and fast.get("mean_step_s"):
            out[f"{other}_over_{base}_step_s"] = slow["mean_step_s"] / fast["mean_step_s"]
    return out


if __name__ == "__main__":
    sys.exit(main("benchmarks/async_publish/config.yaml", ratios))
