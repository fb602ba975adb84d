"""Algorithm suite: GRPO, Dr. GRPO and PPO on the same task and budget, side by side.

    python benchmarks/algorithm/run_benchmark.py --config benchmarks/algorithm/config.yaml

results/YYYYMMDD_HHMMSS/ holds the shared runner's files plus algorithm_reward.png (reward
against samples and against wall time); summary.json adds ``convergence`` (per variant: final
reward, steps/s, samples and seconds to the target reward, the learning curve) and
``table_markdown``, which is also printed. Run nothing else on the machine meanwhile.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.algorithm.convergence import (  # noqa: E402
    check_same_budget,
    markdown_table,
    trailing_mean,
    variant_row,
)
from benchmarks.common.config import BenchmarkConfig  # noqa: E402
from benchmarks.common.runner import run_suite, suite_arg_parser  # noqa: E402


def ratios(figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each variant's steps/s and final reward relative to the first variant."""
    names = list(figures)
    if not names:
        return {}
    base = figures[names[0]]
    out: dict[str, Any] = {}
    for name in names[1:]:
        f = figures[name]
        if base["training_steps_per_s"] > 0:
            out[f"{name}_over_{names[0]}_steps_per_s"] = (
                f["training_steps_per_s"] / base["training_steps_per_s"]
            )
        out[f"{name}_minus_{names[0]}_final_reward"] = f["reward_end"] - base["reward_end"]
    return out


def plot_convergence(
    out: Path, rows: dict[str, dict[str, Any]], target: float, window: int
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_s, ax_t) = plt.subplots(1, 2, figsize=(12, 4))
    for name, row in rows.items():
        curve = row["curve"]
        smooth = trailing_mean([p["reward"] for p in curve], window)
        ax_s.plot([p["samples"] for p in curve], smooth, label=name)
        ax_t.plot([p["time_s"] for p in curve], smooth, label=name)
    for ax, xlabel in ((ax_s, "samples trained on"), (ax_t, "wall time (s)")):
        ax.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.set(xlabel=xlabel, ylabel=f"mean reward (trailing {window} steps)", ylim=(-0.02, 1.02))
        ax.legend()
    ax_s.set_title("reward vs samples")
    ax_t.set_title("reward vs wall time")
    fig.tight_layout()
    fig.savefig(out / "algorithm_reward.png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = suite_arg_parser("benchmarks/algorithm/config.yaml", __doc__)
    parser.add_argument("--target", type=float, default=0.9, help="reward to reach")
    parser.add_argument("--window", type=int, default=5, help="steps in the trailing mean")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error("--window must be >= 1")

    from hybridflow.config.loader import load_config

    check_same_budget(load_config(BenchmarkConfig, args.config))  # before the runs
    out = run_suite(args.config, args.set, args.results, ratios)
    summary = json.loads((out / "summary.json").read_text())
    rows = {
        name: variant_row(out / name, figures, args.target, args.window)
        for name, figures in summary["variants"].items()
    }
    table = markdown_table(rows, args.target, args.window)
    summary["convergence"] = {
        "target_reward": args.target,
        "window_steps": args.window,
        "variants": rows,
    }
    summary["table_markdown"] = table
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if summary["config"].get("plots", True):
        plot_convergence(out, rows, args.target, args.window)
    print(table)
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
