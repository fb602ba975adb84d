"""Convergence figures of the algorithm suite's runs (file reading and arithmetic only).

A run's learning curve is its metrics.jsonl: per step the policy's mean reward, the
cumulative number of samples generated and the wall time since the first step began.
"Samples to reach the target" is the cumulative sample count at the first step where the
trailing mean reward over ``window`` steps reaches the target (None when it never does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common.config import BenchmarkConfig
from benchmarks.common.figures import read_steps

BUDGET_KEYS = (
    "model",
    "coordinator.num_steps",
    "coordinator.prompts_per_step",
    "coordinator.group_size",
    "coordinator.sampling",
    "coordinator.seed",
    "coordinator.data",
    "coordinator.data_size",
    "learner.optimizer.lr",
)
"""Job settings every variant must share: the comparison is at the same budget."""


def check_same_budget(cfg: BenchmarkConfig) -> None:
    """ValueError naming the variant that changes a budget setting."""
    for v in cfg.variants:
        for override in v.overrides:
            key = override.partition("=")[0].strip()
            for budget in BUDGET_KEYS:
                if key == budget or key.startswith(budget + "."):
                    raise ValueError(
                        f"variants[{v.name}].overrides: {key} is part of the shared budget; "
                        "set it in the suite's overrides, not per variant"
                    )


def learning_curve(rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per step: step, cumulative samples generated, seconds since the first step began, the
    policy's mean reward.

    Samples are what the step cost to generate (``batch/num_generated``: with dynamic sampling
    the filtered groups too, with ReMax the greedy baselines; older runs: the trained batch).
    The reward is over every generated group (``dynamic_sampling/score_all_mean``) when dynamic
    sampling filtered some: the trained batch alone leaves out the solved ones."""
    if not rows:
        return []
    t0 = rows[0]["time"] - rows[0]["timing_s/step"]
    samples = 0.0
    out = []
    for r in rows:
        samples += r.get("batch/num_generated", r["batch/num_samples"])
        out.append(
            {
                "step": r["step"],
                "samples": samples,
                "time_s": r["time"] - t0,
                "reward": r.get("dynamic_sampling/score_all_mean", r["critic/score/mean"]),
            }
        )
    return out


def trailing_mean(values: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` values at each position (fewer at the start)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def first_reach(
    curve: list[dict[str, float]], target: float, window: int
) -> dict[str, float] | None:
    """The curve point where the trailing mean reward first reaches ``target``."""
    smooth = trailing_mean([p["reward"] for p in curve], window)
    for point, value in zip(curve, smooth):
        if value >= target:
            return {**point, "smoothed_reward": value}
    return None


def variant_row(
    run_dir: Path, figures: dict[str, Any], target: float, window: int
) -> dict[str, Any]:
    """The table row of one variant."""
    curve = learning_curve(read_steps(run_dir / "metrics.jsonl"))
    reached = first_reach(curve, target, window)
    return {
        "final_reward": figures["reward_end"],
        "start_reward": figures["reward_start"],
        "steps_per_s": figures["training_steps_per_s"],
        "samples_per_s": figures["e2e_samples_per_s"],
        "num_steps": len(curve),
        "total_samples": curve[-1]["samples"] if curve else 0.0,
        "samples_to_target": reached["samples"] if reached else None,
        "seconds_to_target": reached["time_s"] if reached else None,
        "step_to_target": reached["step"] if reached else None,
        "curve": curve,
    }


def markdown_table(rows: dict[str, dict[str, Any]], target: float, window: int) -> str:
    """The comparison as a markdown table."""

    def opt(value: float | None, fmt: str) -> str:
        return "not reached" if value is None else format(value, fmt)

    lines = [
        f"| variant | final reward | steps/s | samples/s | samples to {target:g} "
        f"| seconds to {target:g} |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['final_reward']:.3f} | {r['steps_per_s']:.3f} "
            f"| {r['samples_per_s']:.1f} | {opt(r['samples_to_target'], '.0f')} "
            f"| {opt(r['seconds_to_target'], '.1f')} |"
        )
    lines.append("")
    lines.append(
        f"final reward: mean of the last min(20, steps) batches; target reached: first step whose "
        f"trailing {window}-step mean reward is >= {target:g}."
    )
    return "\n".join(lines)
