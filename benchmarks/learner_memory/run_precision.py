"""bf16 against fp32 on the quickstart: the learning curve and the rollout-vs-learner log-prob
difference of each precision, one run after the other on the same machine.

Each variant is the quickstart (``deploy/configs/quickstart.yaml``, 150 steps, hf engine)
through ``deploy/launch.sh`` with ``learner.memory.dtype`` and ``rollout.dtype`` set:

* ``fp32``: learner and rollout float32 (the default);
* ``bf16_learner``: learner bfloat16 (mixed precision), rollout float32;
* ``bf16``: both bfloat16;
* ``fp32_2ranks`` / ``bf16_learner_2ranks``: the same on a 2-rank FSDP2 learner (a sharded
  learner computes whole blocks in bf16; a single process autocasts, see
  docs/learner-memory.md).

The learner logs, per step, the largest and the mean |learner log-prob - rollout log-prob|
over the batch's response tokens (``training/rollout_logprob_diff_max`` / ``_mean``): the
mismatch an off-policy correction has to absorb. The report gives its medians over the run
and its largest value, the mean reward over windows of steps, and the step time.

    python benchmarks/learner_memory/run_precision.py [--variants fp32,bf16] [--steps 150]
    python benchmarks/learner_memory/run_precision.py --summarize results/precision_...

Writes ``results/precision_YYYYMMDD_HHMMSS/`` (one run dir per variant, ``summary.json``,
``precision.png``). Step times mean something on an idle machine only; the curves and the
differences do not depend on load.
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

CONFIG = "deploy/configs/quickstart.yaml"
VARIANTS: dict[str, dict[str, str]] = {
    "fp32": {"learner.memory.dtype": "float32", "rollout.dtype": "float32"},
    "bf16_learner": {"learner.memory.dtype": "bfloat16", "rollout.dtype": "float32"},
    "bf16": {"learner.memory.dtype": "bfloat16", "rollout.dtype": "bfloat16"},
    "fp32_2ranks": {
        "learner.memory.dtype": "float32",
        "rollout.dtype": "float32",
        "learner.topology.nproc_per_node": "2",
    },
    "bf16_learner_2ranks": {
        "learner.memory.dtype": "bfloat16",
        "rollout.dtype": "float32",
        "learner.topology.nproc_per_node": "2",
    },
}
WINDOWS = ((0, 1), (40, 60), (90, 110), (-20, None))
REWARD = "critic/score/mean"
DIFF_MAX = "training/rollout_logprob_diff_max"
DIFF_MEAN = "training/rollout_logprob_diff_mean"


def run_variant(name: str, out: Path, steps: int) -> None:
    """One quickstart of ``name`` into ``out/name``; raises if the launch fails."""
    overrides = {**VARIANTS[name], "coordinator.num_steps": str(steps)}
    launch_variant(name, CONFIG, overrides, out)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Reward windows, log-prob difference and step time of one run."""
    rewards = [r[REWARD] for r in rows]
    diff_max = [r[DIFF_MAX] for r in rows if DIFF_MAX in r]
    diff_mean = [r[DIFF_MEAN] for r in rows if DIFF_MEAN in r]
    if not diff_max:
        raise SystemExit(f"the runs do not log {DIFF_MAX}: a tree older than this benchmark")
    windows = {}
    for lo, hi in WINDOWS:
        part = rewards[lo:hi]
        label = "last_20" if lo < 0 else f"steps_{lo + 1}_{hi}"
        windows[label] = round(statistics.fmean(part), 4) if part else None
    return {
        "steps": len(rows),
        "reward": windows,
        "logprob_diff_max_median": statistics.median(diff_max),
        "logprob_diff_max_largest": max(diff_max),
        "logprob_diff_mean_median": statistics.median(diff_mean),
        "step_s_median": round(statistics.median(r["timing_s/step"] for r in rows), 4),
    }


def plot(out: Path, runs: dict[str, list[dict[str, Any]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_d) = plt.subplots(1, 2, figsize=(12, 4))
    for name, rows in runs.items():
        steps = [r["step"] for r in rows]
        ax_r.plot(steps, [r[REWARD] for r in rows], label=name, linewidth=1)
        ax_d.semilogy(steps, [max(r.get(DIFF_MAX, 0.0), 1e-9) for r in rows], label=name)
    ax_r.set(xlabel="step", ylabel="mean reward", title="quickstart reward per precision")
    ax_d.set(xlabel="step", ylabel="max |logp learner - logp rollout|", title="log-prob mismatch")
    ax_r.legend()
    ax_d.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "precision.png", dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--summarize", type=Path, default=None, help="an earlier results dir")
    args = parser.parse_args()
    names = [n for n in args.variants.split(",") if n]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    if args.summarize is not None:
        out = args.summarize
        names = [n for n in names if (out / n).is_dir()]
    else:
        out = REPO / "results" / time.strftime("precision_%Y%m%d_%H%M%S")
        out.mkdir(parents=True)
        for name in names:
            print(f"{name} ...", flush=True)
            run_variant(name, out, args.steps)
    runs = {name: variant_metrics(out, name) for name in names}
    summary = {name: summarize(rows) for name, rows in runs.items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(out, runs)
    for name, s in summary.items():
        reward = " ".join(f"{v:.3f}" for v in s["reward"].values())
        print(
            f"{name:20s} reward {reward}  |dlogp| max median {s['logprob_diff_max_median']:.2e}"
            f" (largest {s['logprob_diff_max_largest']:.2e}), mean median "
            f"{s['logprob_diff_mean_median']:.2e}  step {s['step_s_median']:.3f} s"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
