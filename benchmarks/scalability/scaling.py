"""Scaling efficiency and saturation from the scalability variants' figures (pure arithmetic).

A variant is placed by its (rollout replicas, learner ranks). Rollout scaling compares the
variants with the smallest learner size; learner scaling those with the smallest replica count.
Speed-up is against the smallest size of the series; efficiency is speed-up over the ideal
(size ratio). A series saturates at size n when going from n to the next size gives less than
half of the ideal extra speed-up (``marginal_gain < 0.5``).
"""

from __future__ import annotations

from typing import Any

ROLLOUT_METRICS = ("generation_tokens_per_s", "e2e_samples_per_s")
LEARNER_METRICS = ("training_samples_per_s", "e2e_samples_per_s")
SATURATION_GAIN = 0.5
"""Below this share of the ideal marginal speed-up, the series counts as saturated."""


def series(
    figures: dict[str, dict[str, Any]],
    sizes: dict[str, tuple[int, int]],
    axis: int,
    metrics: tuple[str, ...],
) -> dict[str, Any]:
    """One scaling series along ``axis`` (0: rollout replicas, 1: learner ranks)."""
    present = {n: s for n, s in sizes.items() if n in figures}
    if not present:
        return {}
    fixed = min(s[1 - axis] for s in present.values())
    points = sorted(
        ((s[axis], n) for n, s in present.items() if s[1 - axis] == fixed), key=lambda p: p[0]
    )
    if len(points) < 2:
        return {}
    primary = metrics[0]
    base_size, base_name = points[0]
    rows = []
    saturated_at: int | None = None
    prev: dict[str, Any] | None = None
    for size, name in points:
        row: dict[str, Any] = {"variant": name, "size": size}
        for m in metrics:
            base = figures[base_name][m]
            value = figures[name][m]
            speedup = value / base if base > 0 else 0.0
            row[m] = value
            row[f"{m}_speedup"] = speedup
            row[f"{m}_efficiency"] = speedup / (size / base_size)
        if prev is not None:
            ideal = size / prev["size"] - 1.0
            got = (
                row[f"{primary}_speedup"] / prev[f"{primary}_speedup"] - 1.0
                if prev[f"{primary}_speedup"] > 0
                else 0.0
            )
            row["marginal_gain"] = got / ideal if ideal > 0 else 0.0
            if saturated_at is None and row["marginal_gain"] < SATURATION_GAIN:
                saturated_at = prev["size"]
        rows.append(row)
        prev = row
    return {
        "metric": primary,
        "fixed_other_axis": fixed,
        "points": rows,
        "saturated_at": saturated_at,
    }


def verdict(name: str, unit: str, s: dict[str, Any], cpus: int | None) -> str:
    """One plain sentence about a series: speed-ups, efficiencies and where it saturates."""
    if not s:
        return f"{name}: fewer than two variants, no scaling figure"
    m = s["metric"]
    steps = ", ".join(
        f"{s['points'][0]['size']}->{p['size']} x{p[f'{m}_speedup']:.2f} "
        f"(efficiency {p[f'{m}_efficiency']:.0%})"
        for p in s["points"][1:]
    )
    cores = f"; the machine has {cpus} CPU cores shared by every service" if cpus else ""
    if s["saturated_at"] is None:
        end = f"no saturation up to {_count(s['points'][-1]['size'], unit)}"
    else:
        end = f"saturates at {_count(s['saturated_at'], unit)}"
    return f"{name} ({m}): {steps}; {end}{cores}"


def _count(n: int, unit: str) -> str:
    return f"{n} {unit if n != 1 else unit.removesuffix('s')}"


def scaling_ratios(
    figures: dict[str, dict[str, Any]], sizes: dict[str, tuple[int, int]], cpus: int | None
) -> dict[str, Any]:
    """The suite's ratios block: both series and their verdicts."""
    rollout = series(figures, sizes, 0, ROLLOUT_METRICS)
    learner = series(figures, sizes, 1, LEARNER_METRICS)
    return {
        "rollout_scaling": rollout,
        "learner_scaling": learner,
        "verdict": [
            verdict("rollout replicas", "replicas", rollout, cpus),
            verdict("learner ranks", "ranks", learner, cpus),
        ],
    }
