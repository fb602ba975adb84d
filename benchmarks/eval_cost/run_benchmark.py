"""Evaluation's cost in an async run: seconds per step with held-out evaluation every 10
steps (``eval_on``) against none (``eval_off``), in one run, and evaluation's own share of
the generation time, the floor of what it can cost when it shares the replicas.

    python benchmarks/eval_cost/run_benchmark.py        # 60 steps, 2 variants x 3 runs

results/YYYYMMDD_HHMMSS/summary.json: per variant the shared runner's figures (mean_step_s,
eval_s: the evaluations' seconds in the timed steps, eval_hold_wait_s: how long weight
publishes waited for them, mean_gen_s_per_step); ``ratios``: on over off seconds per step,
and the evaluations' share of all generation (training's generate calls plus the
evaluations'). Run nothing else on the machine meanwhile.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common.runner import main  # noqa: E402


def ratios(figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    on, off = figures.get("eval_on"), figures.get("eval_off")
    if on and off and off.get("mean_step_s"):
        out["eval_on_over_off_step_s"] = on["mean_step_s"] / off["mean_step_s"]
    if on:
        generation = on["mean_gen_s_per_step"] * on["steps_timed"] + on["eval_s"]
        out["eval_share_of_generation"] = on["eval_s"] / generation if generation else 0.0
        out["eval_hold_wait_share_of_wall"] = (
            on["eval_hold_wait_s"] / on["wall_s"] if on["wall_s"] else 0.0
        )
    return out


if __name__ == "__main__":
    sys.exit(main("benchmarks/eval_cost/config.yaml", ratios))
