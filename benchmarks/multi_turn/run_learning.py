"""Multi-turn RL learns on this machine: the built-in calculator and guessing-game
environments, each through ``deploy/launch.sh`` with the environment service, one run after
the other.

* ``calc``: ``deploy/configs/calc-tools.yaml`` (``builtin:tiny-tools``, the calculator tool);
* ``calc_no_tool``: the same with ``NoToolCalculatorEnv`` (every tool call is answered with an
  error): the baseline a model that cannot multiply in its head stays at;
* ``calc_async``: ``calc`` with ``max_staleness: 2`` (asynchronous multi-turn PPO);
* ``guess``: ``deploy/configs/guess-number.yaml`` (7 guesses, binary search's bound);
* ``guess_10_turns``: the same with 10 (the warm start's slower search wins too, in more
  turns: the room there is in turns per success).

Per step the coordinator logs ``episode/*`` (turns, tool calls, tool-use rate, success rate,
turns per success) and ``critic/score/mean`` (the environments' reward). The report gives
their means over windows of steps; the figure plots them.

    python benchmarks/multi_turn/run_learning.py [--variants calc,calc_no_tool] [--steps 60]
        [--set learner.optimizer.lr=3e-4]
    python benchmarks/multi_turn/run_learning.py --summarize results/multi_turn_...

Writes ``results/multi_turn_YYYYMMDD_HHMMSS/`` (one run dir per variant, ``summary.json``,
``learning.png``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.common.launches import launch_variant, variant_metrics  # noqa: E402

CALC, GUESS = "deploy/configs/calc-tools.yaml", "deploy/configs/guess-number.yaml"
NO_TOOL = "hybridflow.envs.calculator:NoToolCalculatorEnv"
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "calc": (CALC, {}),
    "calc_no_tool": (
        CALC,
        {"coordinator.multi_turn.env": NO_TOOL, "environment.envs": f"[{NO_TOOL}]"},
    ),
    "calc_async": (
        CALC,
        {"coordinator.max_staleness": "2", "rollout.in_flight_weights": "continue_new"},
    ),
    "guess": (GUESS, {}),
    "guess_10_turns": (GUESS, {"coordinator.multi_turn.max_turns": "10"}),
}
SERIES = (
    "critic/score/mean",
    "episode/success_rate",
    "episode/tool_use_rate",
    "episode/turns/mean",
    "episode/turns_per_success",
    "episode/tool_errors/mean",
)


LABELS = {
    "critic/score/mean": "reward",
    "episode/success_rate": "success",
    "episode/tool_use_rate": "tool_use",
    "episode/turns/mean": "turns",
    "episode/turns_per_success": "turns/success",
    "episode/tool_errors/mean": "tool_errors",
}


def run_variant(name: str, out: Path, steps: int, extra: dict[str, str]) -> None:
    config, overrides = VARIANTS[name]
    launch_variant(name, config, {**overrides, **extra, "coordinator.num_steps": str(steps)}, out)


def windows(rows: list[dict[str, Any]], key: str, width: int) -> dict[str, float | None]:
    """Means of ``key`` over the first and last ``width`` steps."""
    values = [r[key] for r in rows if key in r]
    if not values:
        return {"first": None, "last": None}
    return {
        "first": round(statistics.fmean(values[:width]), 4),
        "last": round(statistics.fmean(values[-width:]), 4),
    }


def summarize(rows: list[dict[str, Any]], width: int) -> dict[str, Any]:
    return {
        "steps": len(rows),
        "window": width,
        **{key: windows(rows, key, width) for key in SERIES},
        "step_s_median": round(statistics.median(r["timing_s/step"] for r in rows), 3),
    }


PANELS = (
    ("calc", "critic/score/mean", "calculator: reward (success)"),
    ("calc", "episode/tool_use_rate", "calculator: tool-use rate"),
    ("guess", "episode/success_rate", "guessing game: success rate"),
    ("guess", "episode/turns_per_success", "guessing game: turns per success"),
)


def plot(out: Path, runs: dict[str, list[dict[str, Any]]], smooth: int = 5) -> None:
    """One panel per (environment, series) with runs of that environment; each curve a
    ``smooth``-step moving average."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in PANELS if any(name.startswith(p[0]) for name in runs)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (env, key, title) in zip(axes[0], panels):
        for name, rows in runs.items():
            points = [(r["step"], r[key]) for r in rows if key in r and name.startswith(env)]
            if not points:
                continue
            steps, values = zip(*points)
            averaged = [
                sum(values[max(0, i - smooth + 1) : i + 1])
                / len(values[max(0, i - smooth + 1) : i + 1])
                for i in range(len(values))
            ]
            ax.plot(steps, averaged, label=name, linewidth=1.2)
        ax.set(xlabel="step", title=title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "learning.png", dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--window", type=int, default=10, help="steps per reported mean")
    parser.add_argument("--summarize", type=Path, default=None, help="an earlier results dir")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="for every variant"
    )
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.set)
    names = [n for n in args.variants.split(",") if n]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    if args.summarize is not None:
        out = args.summarize
        names = [n for n in names if (out / n).is_dir()]
    else:
        out = REPO / "results" / time.strftime("multi_turn_%Y%m%d_%H%M%S")
        out.mkdir(parents=True)
        for name in names:
            print(f"{name} ...", flush=True)
            run_variant(name, out, args.steps, extra)
    runs = {name: variant_metrics(out, name) for name in names}
    summary = {name: summarize(rows, args.window) for name, rows in runs.items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(out, runs)
    for name, s in summary.items():
        cells = "  ".join(
            f"{LABELS[key]} {s[key]['first']} -> {s[key]['last']}"
            for key in SERIES
            if s[key]["first"] is not None
        )
        print(f"{name:14s} {cells}  step {s['step_s_median']} s")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
