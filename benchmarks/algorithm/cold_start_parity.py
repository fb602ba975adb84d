"""Cold-start learning, hybridflow against TRL: GRPO from a random init, seeds side by side.

    python benchmarks/algorithm/cold_start_parity.py --seeds 5          # ~10 min on 2 cores
    python benchmarks/algorithm/cold_start_parity.py --seeds 1 --steps 4   # a smoke run

For every seed, three runs of the algorithm suite's cold start (``run_benchmark.COLD_START``:
``builtin:tiny-random``, 300 steps of 8 prompts x 8 completions, lr 3e-3, format_score 0.1):
- ``trl``: TRL's ``GRPOTrainer`` (``trl_cold_start.py``);
- ``sync``: hybridflow through ``deploy/launch.sh``, on-policy (``max_staleness 0``);
- ``async``: hybridflow with ``max_staleness 2`` and truncated importance sampling.
The seed sets the data, the sampling and the learner (``coordinator.seed``, ``learner.seed``;
TRL's ``seed``). Written to ``results/YYYYMMDD_HHMMSS_cold_start/``: each run's curve,
``summary.json`` (per system and seed the mean reward over the second half of the steps,
their mean and range) and ``cold_start_parity.png``. Run nothing else on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.algorithm.convergence import learning_curve  # noqa: E402
from benchmarks.algorithm.run_benchmark import COLD_START  # noqa: E402
from benchmarks.common.config import NO_EVALUATION  # noqa: E402
from benchmarks.common.figures import read_jsonl, read_steps  # noqa: E402

SYSTEMS = {
    "sync": ["coordinator.max_staleness=0"],
    "async": ["coordinator.max_staleness=2", "learner.loss.off_policy=tis"],
}
"""hybridflow's variants: overrides on top of COLD_START."""


def hybridflow_curve(out: Path, seed: int, steps: int, overrides: list[str]) -> list[float]:
    sets = [
        *COLD_START, *overrides, f"coordinator.num_steps={steps}", f"coordinator.seed={seed}",
        f"learner.seed={seed}", "coordinator.save_checkpoint=false", "coordinator.progress=false",
    ]  # fmt: skip
    cmd = [str(REPO / "deploy" / "launch.sh"), "--config", "deploy/configs/quickstart.yaml"]
    cmd += ["--run-dir", str(out), "--set", NO_EVALUATION]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return [p["reward"] for p in learning_curve(read_steps(out / "metrics.jsonl"))]


def trl_curve(out: Path, seed: int, steps: int) -> list[float]:
    curve = out / "rewards.jsonl"
    script = REPO / "benchmarks" / "algorithm" / "trl_cold_start.py"
    cmd = [sys.executable, str(script), "--seed", str(seed), "--steps", str(steps)]
    subprocess.run([*cmd, "--out", str(curve)], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return [row["reward"] for row in read_jsonl(curve)]


def second_half_mean(curve: list[float]) -> float:
    half = curve[len(curve) // 2 :]
    return sum(half) / len(half) if half else float("nan")


def summarize(curves: dict[str, dict[int, list[float]]]) -> dict[str, Any]:
    """Per system: each seed's second-half mean, their mean, min and max."""
    out: dict[str, Any] = {}
    for system, by_seed in curves.items():
        means = {seed: second_half_mean(c) for seed, c in by_seed.items()}
        values = list(means.values())
        out[system] = {
            "per_seed": means,
            "mean": sum(values) / len(values),
            "min": min(values),
            "max": max(values),
        }
    return out


def table(summary: dict[str, Any], steps: int) -> str:
    lines = [
        f"| system | mean reward over steps {steps // 2 + 1}-{steps} | range | seeds |",
        "|---|---:|---|---:|",
    ]
    for system, row in summary.items():
        lines.append(
            f"| {system} | {row['mean']:.3f} | {row['min']:.3f}-{row['max']:.3f} "
            f"| {len(row['per_seed'])} |"
        )
    return "\n".join(lines)


def plot(out: Path, curves: dict[str, dict[int, list[float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for system, by_seed in curves.items():
        runs = list(by_seed.values())
        length = min(len(c) for c in runs)
        mean = [sum(c[i] for c in runs) / len(runs) for i in range(length)]
        ax.plot(range(1, length + 1), mean, label=f"{system} (mean of {len(runs)} seeds)")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.legend()
    ax.set_title("cold-start GRPO: hybridflow vs TRL")
    fig.tight_layout()
    fig.savefig(out / "cold_start_parity.png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--results", type=Path, default=REPO / "results")
    args = parser.parse_args(argv)
    out = args.results / (time.strftime("%Y%m%d_%H%M%S") + "_cold_start")
    curves: dict[str, dict[int, list[float]]] = {"trl": {}, **{s: {} for s in SYSTEMS}}
    for seed in range(args.seeds):
        print(f"seed {seed}: trl", file=sys.stderr, flush=True)
        curves["trl"][seed] = trl_curve(out / f"trl_seed{seed}", seed, args.steps)
        for system, overrides in SYSTEMS.items():
            print(f"seed {seed}: {system}", file=sys.stderr, flush=True)
            run_dir = out / f"{system}_seed{seed}"
            curves[system][seed] = hybridflow_curve(run_dir, seed, args.steps, overrides)
    summary = summarize(curves)
    text = table(summary, args.steps)
    record = {"steps": args.steps, "seeds": args.seeds, "systems": summary, "table": text}
    (out / "summary.json").write_text(json.dumps(record, indent=2) + "\n")
    plot(out, curves)
    print(text)
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
