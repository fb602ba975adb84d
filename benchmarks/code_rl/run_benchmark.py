"""Code RL with the sandboxed code scorer: seconds per step with scoring beside generation
(``overlap_on``, coordinator.overlap_scoring) against after it (``overlap_off``) and against
a scorer that runs nothing (``no_sandbox``), in one run.

    python benchmarks/code_rl/run_benchmark.py        # 40 steps, 3 variants x 2 runs

results/YYYYMMDD_HHMMSS/summary.json: per variant the shared runner's figures (mean_step_s,
mean_score_s_per_step, mean_gen_s_per_step, mean_learner_compute_s, reward_start/end);
``ratios``: on over off seconds per step; per sandboxed variant, the seconds per step it adds
over no_sandbox as a share of its step (what running the programs still costs); and per
variant the reward calls' seconds over the step's. Run nothing
else on the machine meanwhile.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common.runner import main  # noqa: E402


def ratios(figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    on, off = figures.get("overlap_on"), figures.get("overlap_off")
    if on and off and off.get("mean_step_s"):
        out["overlap_on_over_off_step_s"] = on["mean_step_s"] / off["mean_step_s"]
    base = figures.get("no_sandbox")
    for name in ("overlap_on", "overlap_off"):
        fig = figures.get(name)
        if fig and base and fig.get("mean_step_s"):
            added = fig["mean_step_s"] - base["mean_step_s"]
            out[f"{name}_added_s_per_step"] = added
            out[f"{name}_added_share_of_step"] = added / fig["mean_step_s"]
    for name, fig in figures.items():
        if fig.get("mean_step_s"):
            out[f"{name}_score_s_over_step_s"] = fig["mean_score_s_per_step"] / fig["mean_step_s"]
    return out


if __name__ == "__main__":
    sys.exit(main("benchmarks/code_rl/config.yaml", ratios))
