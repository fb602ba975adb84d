"""Throughput suite: the headline figures, synchronous against asynchronous PPO, side by side.

python benchmarks/throughput/run_benchmark.py --config benchmarks/throughput/config.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common.runner import main  # noqa: E402


def ratios(figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    sync, asyn = figures.get("sync"), figures.get("async")
    if sync and asyn:
        gen, train = sync["mean_gen_s_per_step"], sync["mean_train_s_per_step"]
        ideal = (gen + train) / max(gen, train)
        achieved = asyn["e2e_samples_per_s"] / sync["e2e_samples_per_s"]
        out["async_over_sync_samples_per_s"] = achieved
        out["ideal_async_over_sync"] = ideal
        out["async_share_of_ideal"] = achieved / ideal
    off = figures.get("async_planner_off")
    if asyn and off:
        out["planner_on_over_off_samples_per_s"] = (
            asyn["e2e_samples_per_s"] / off["e2e_samples_per_s"]
        )
        if asyn["mean_sync_s"] > 0:
            out["planner_off_over_on_sync_s"] = off["mean_sync_s"] / asyn["mean_sync_s"]
    return out


if __name__ == "__main__":
    sys.exit(main("benchmarks/throughput/config.yaml", ratios))
