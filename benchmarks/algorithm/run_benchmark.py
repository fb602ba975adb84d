"""Algorithm suite: every RL method of config.yaml on one task and budget, side by side.

    python benchmarks/algorithm/run_benchmark.py --config benchmarks/algorithm/config.yaml
    python benchmarks/algorithm/run_benchmark.py --cold-start   # from a random init

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

    fig, (ax_s, ax_t) = plt.subplots(1, 2, figsize=(14, 5))
    colors = plt.get_cmap("tab20").colors  # one per variant: a dozen methods stay apart
    top = target
    for i, (name, row) in enumerate(rows.items()):
        curve = row["curve"]
        smooth = trailing_mean([p["reward"] for p in curve], window)
        top = max([top, *smooth])
        style = {"label": name, "color": colors[i % len(colors)], "linestyle": "-:"[i // 10 % 2]}
        ax_s.plot([p["samples"] for p in curve], smooth, **style)
        ax_t.plot([p["time_s"] for p in curve], smooth, **style)
    for ax, xlabel in ((ax_s, "samples generated"), (ax_t, "wall time (s)")):
        ax.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.set(
            xlabel=xlabel,
            ylabel=f"mean reward (trailing {window} steps)",
            ylim=(-0.02, min(1.02, top + 0.05)),
        )
        ax.legend(fontsize=7)
    ax_s.set_title("reward vs samples generated")
    ax_t.set_title("reward vs wall time")
    fig.tight_layout()
    fig.savefig(out / "algorithm_reward.png", dpi=100)
    plt.close(fig)


COLD_START = [
    "model=builtin:tiny-random",
    "coordinator.data=builtin:arith",  # all 100 problems, as TRL's cold start reads
    "coordinator.num_steps=300",
    "coordinator.prompts_per_step=8",
    "reward.format_score=0.1",
    "learner.optimizer.lr=3.0e-3",
]
"""``--cold-start``: every method from the randomly initialised built-in model (no warm
start), 300 steps of 8 prompts x 8 = 64 completions. The exact-match reward alone is ~0 for
a random policy (no signal for any method: measured 0.000 over 300 steps), so an integer
answer earns verl's format_score 0.1; the learning rate is the best of 2e-4 / 1e-3 / 3e-3
for GRPO from scratch (measured: 0.069 / 0.100 / 0.167 final reward)."""
COLD_START_TARGET = 0.15
"""The cold start's default target: format learned and some sums right."""


def main(argv: list[str] | None = None) -> int:
    parser = suite_arg_parser("benchmarks/algorithm/config.yaml", __doc__)
    parser.add_argument(
        "--cold-start",
        action="store_true",
        help="from a randomly initialised model: " + " ".join(COLD_START),
    )
    parser.add_argument(
        "--target", type=float, default=None, help="reward to reach (0.9; cold start 0.15)"
    )
    parser.add_argument("--window", type=int, default=5, help="steps in the trailing mean")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error("--window must be >= 1")
    if args.target is None:
        args.target = COLD_START_TARGET if args.cold_start else 0.9
    if args.cold_start:
        args.set = [*COLD_START, *args.set]

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
