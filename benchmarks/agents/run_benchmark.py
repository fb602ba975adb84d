"""The agent endpoint against the coordinator's own multi-turn loop on the same episodes
(the calculator task): completions per second end to end, in one run.

    python benchmarks/agents/run_benchmark.py        # 20 steps, 2 variants x 2 runs

results/YYYYMMDD_HHMMSS/summary.json: per variant the shared runner's figures;
``ratios``: the endpoint's completions/s over the loop's, and its generation seconds per
step over the loop's. Run nothing else on the machine meanwhile.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common.runner import main  # noqa: E402


def ratios(figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    endpoint, loop = figures.get("endpoint"), figures.get("loop")
    if not (endpoint and loop and loop.get("e2e_samples_per_s")):
        return {}
    return {
        "endpoint_over_loop_samples_per_s": endpoint["e2e_samples_per_s"]
        / loop["e2e_samples_per_s"],
        "endpoint_over_loop_gen_s_per_step": endpoint["mean_gen_s_per_step"]
        / loop["mean_gen_s_per_step"],
    }


if __name__ == "__main__":
    sys.exit(main("benchmarks/agents/config.yaml", ratios))
