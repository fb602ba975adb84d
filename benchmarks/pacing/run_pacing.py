"""Pacing suite: paced against greedy admission at max_staleness 2, beside synchronous PPO, on
a workload where generation is faster than training and one where it is slower.

    python benchmarks/pacing/run_pacing.py                 # 300 steps, 6 runs
    python benchmarks/pacing/run_pacing.py --steps 3       # smoke run

Variants are ``<workload>_<schedule>`` (benchmarks/pacing/config.yaml); every run goes
through deploy/launch.sh with the real services (the shared runner). results/YYYYMMDD_HHMMSS/
holds the runner's files plus pacing_reward.png (reward over steps per workload, sync beside
greedy and pace); summary.json adds ``pacing``: per workload the sync variant's generation
and training seconds per step (which side is faster), per schedule samples/s, mean staleness,
the staleness histogram, the final reward and the admission lead, and pace / greedy samples/s.
``table_markdown`` is printed too. Run nothing else on the machine meanwhile.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.algorithm.convergence import trailing_mean  # noqa: E402
from benchmarks.common.figures import mean, read_steps  # noqa: E402
from benchmarks.common.runner import run_suite, suite_arg_parser  # noqa: E402

SCHEDULES = ("sync", "greedy", "pace")


def split_name(name: str) -> tuple[str, str]:
    """``genfast_pace`` -> (``genfast``, ``pace``)."""
    workload, _, schedule = name.rpartition("_")
    if not workload or schedule not in SCHEDULES:
        raise ValueError(f"variant {name!r}: expected <workload>_<{'|'.join(SCHEDULES)}>")
    return workload, schedule


def mean_staleness(histogram: dict[str, int]) -> float:
    total = sum(histogram.values())
    return sum(int(k) * n for k, n in histogram.items()) / total if total else 0.0


def ratios(figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per workload: pace / greedy (and / sync) samples/s, and whether generation was the
    faster side in the sync run."""
    out: dict[str, Any] = {}
    by_workload: dict[str, dict[str, dict[str, Any]]] = {}
    for name, fig in figures.items():
        workload, schedule = split_name(name)
        by_workload.setdefault(workload, {})[schedule] = fig
    for workload, runs in by_workload.items():
        pace, greedy, sync = runs.get("pace"), runs.get("greedy"), runs.get("sync")
        if pace and greedy and greedy["e2e_samples_per_s"] > 0:
            out[f"{workload}_pace_over_greedy_samples_per_s"] = (
                pace["e2e_samples_per_s"] / greedy["e2e_samples_per_s"]
            )
        for name, run in (("pace", pace), ("greedy", greedy)):
            if run and sync and sync["e2e_samples_per_s"] > 0:
                out[f"{workload}_{name}_over_sync_samples_per_s"] = (
                    run["e2e_samples_per_s"] / sync["e2e_samples_per_s"]
                )
        if sync:
            out[f"{workload}_generation_faster_than_training"] = (
                sync["mean_gen_s_per_step"] < sync["mean_train_s_per_step"]
            )
    return out


def variant_row(name: str, fig: dict[str, Any], metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's pacing figures (``metrics``: its metrics.jsonl rows)."""
    leads = [m["async/lead_steps"] for m in metrics if "async/lead_steps" in m]
    return {
        "samples_per_s": fig["e2e_samples_per_s"],
        "mean_staleness": mean_staleness(fig["staleness_histogram"]),
        "staleness_histogram": fig["staleness_histogram"],
        "dropped_stale": fig["dropped_stale"],
        "reward_start": fig["reward_start"],
        "reward_end": fig["reward_end"],
        "gen_s_per_step": fig["mean_gen_s_per_step"],
        "train_s_per_step": fig["mean_train_s_per_step"],
        "learner_idle_ratio": fig["learner_idle_ratio"],
        "rollout_idle_ratio": fig["rollout_idle_ratio"],
        "mean_lead_steps": mean(leads),
        "final_lead_steps": leads[-1] if leads else None,
    }


def markdown_table(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| variant | samples/s | mean staleness | staleness histogram | reward start → end "
        "| lead (mean, final) | gen s / train s per step |",
        "|---|---:|---:|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['samples_per_s']:,.0f} | {r['mean_staleness']:.2f} "
            f"| {r['staleness_histogram']} | {r['reward_start']:.2f} → {r['reward_end']:.2f} "
            f"| {r['mean_lead_steps']:.2f}, {r['final_lead_steps']} "
            f"| {r['gen_s_per_step']:.3f} / {r['train_s_per_step']:.3f} |"
        )
    return "\n".join(lines)


def plot_rewards(out: Path, names: list[str], window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({split_name(n)[0] for n in names})
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        for name in names:
            if split_name(name)[0] != workload:
                continue
            rows = read_steps(out / name / "metrics.jsonl")
            smooth = trailing_mean([r["critic/score/mean"] for r in rows], window)
            ax.plot([r["step"] for r in rows], smooth, label=split_name(name)[1])
        ax.set(
            xlabel="step",
            ylabel=f"mean reward (trailing {window} steps)",
            title=f"{workload}: reward over steps",
            ylim=(-0.02, 1.02),
        )
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "pacing_reward.png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = suite_arg_parser("benchmarks/pacing/config.yaml", __doc__)
    parser.add_argument("--steps", type=int, default=300, help="train steps per run")
    parser.add_argument("--window", type=int, default=10, help="steps in the reward mean")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.window < 1:
        parser.error("--steps and --window must be >= 1")
    out = run_suite(
        args.config, [*args.set, f"coordinator.num_steps={args.steps}"], args.results, ratios
    )
    summary = json.loads((out / "summary.json").read_text())
    names = list(summary["variants"])
    rows = {
        name: variant_row(name, summary["variants"][name], read_steps(out / name / "metrics.jsonl"))
        for name in names
    }
    summary["pacing"] = rows
    summary["table_markdown"] = markdown_table(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_rewards(out, names, args.window)
    print(summary["table_markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
