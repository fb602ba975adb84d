"""Scalability suite: rollout replicas 1 -> 2 -> 4 and learner ranks 1 -> 2, side by side,
then the simulated-scale section (coordinator dispatch overhead with many instant replicas,
planner cost on a 70B-class topology) in this process.

    python benchmarks/scalability/run_benchmark.py --config benchmarks/scalability/config.yaml

results/YYYYMMDD_HHMMSS/ holds the shared runner's files (summary.json, detailed.log,
profile.svg, reward_throughput.png, timeline.png) plus scaling.png; summary.json adds
``ratios.rollout_scaling`` / ``ratios.learner_scaling`` / ``ratios.verdict`` and ``simulated``.
Run nothing else on the machine meanwhile.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.common.config import BenchmarkConfig  # noqa: E402
from benchmarks.common.runner import run_suite, suite_arg_parser  # noqa: E402
from benchmarks.scalability.config import SimulatedConfig  # noqa: E402
from benchmarks.scalability.scaling import scaling_ratios  # noqa: E402


def variant_sizes(config_path: str, extra: list[str]) -> dict[str, tuple[int, int]]:
    """(rollout replicas, learner ranks) of every variant, from its resolved job config."""
    from hybridflow.config.loader import load_config
    from hybridflow.job_config import load_job_config

    cfg = load_config(BenchmarkConfig, config_path)
    job_path = Path(cfg.job) if Path(cfg.job).is_absolute() else REPO / cfg.job
    sizes = {}
    for v in cfg.variants:
        job = load_job_config(job_path, [*cfg.overrides, *extra, *v.overrides])
        sizes[v.name] = (job.rollout.replicas, job.learner.topology.nproc_per_node)
    return sizes


def plot_scaling(out: Path, ratios: dict[str, Any], simulated: dict[str, Any] | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_s, ax_d) = plt.subplots(1, 2, figsize=(12, 4))
    top = 1
    for key, label in (
        ("rollout_scaling", "rollout replicas"),
        ("learner_scaling", "learner ranks"),
    ):
        s = ratios.get(key) or {}
        if not s:
            continue
        m = s["metric"]
        sizes = [p["size"] for p in s["points"]]
        ax_s.plot(sizes, [p[f"{m}_speedup"] for p in s["points"]], "o-", label=f"{label} ({m})")
        top = max(top, *sizes)
    ax_s.plot([1, top], [1, top], "k--", label="ideal")
    ax_s.set(xlabel="processes", ylabel="speed-up", title="measured scaling")
    ax_s.legend()
    if simulated:
        rows = simulated["dispatch_overhead"]
        ax_d.plot([r["replicas"] for r in rows], [r["us_per_sample"] for r in rows], "o-")
        ax_d.set_xscale("log", base=2)
    ax_d.set(
        xlabel="instant fake replicas",
        ylabel="coordinator us per sample",
        title="simulated: dispatch overhead",
    )
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = suite_arg_parser("benchmarks/scalability/config.yaml", __doc__)
    defaults = SimulatedConfig()
    parser.add_argument("--no-simulated", action="store_true", help="skip the simulated section")
    parser.add_argument(
        "--sim-replicas",
        default=",".join(map(str, defaults.replicas)),
        help="comma-separated fake replica counts",
    )
    parser.add_argument("--sim-prompts", type=int, default=defaults.prompts_per_step)
    parser.add_argument("--sim-group", type=int, default=defaults.group_size)
    parser.add_argument("--sim-steps", type=int, default=defaults.num_steps)
    parser.add_argument("--plan-layers", type=int, default=defaults.plan_layers)
    parser.add_argument("--plan-num-src", type=int, default=defaults.plan_num_src)
    parser.add_argument("--plan-tp", type=int, default=defaults.plan_tp)
    parser.add_argument("--plan-replicas", type=int, default=defaults.plan_replicas)
    args = parser.parse_args(argv)
    sim = SimulatedConfig(
        enabled=not args.no_simulated,
        replicas=[int(x) for x in args.sim_replicas.split(",") if x.strip()],
        prompts_per_step=args.sim_prompts,
        group_size=args.sim_group,
        num_steps=args.sim_steps,
        plan_layers=args.plan_layers,
        plan_num_src=args.plan_num_src,
        plan_tp=args.plan_tp,
        plan_replicas=args.plan_replicas,
    )
    try:
        sim.validate()  # before the (long) variants run
    except ValueError as exc:
        parser.error(str(exc))

    import torch

    torch.set_num_threads(1)
    sizes = variant_sizes(args.config, args.set)
    cpus = os.cpu_count()
    out = run_suite(
        args.config, args.set, args.results, lambda figs: scaling_ratios(figs, sizes, cpus)
    )
    summary = json.loads((out / "summary.json").read_text())
    summary["variant_sizes"] = {
        n: {"rollout_replicas": r, "learner_ranks": w} for n, (r, w) in sizes.items()
    }
    simulated = None
    if sim.enabled:
        from benchmarks.scalability.simulated import run_simulated

        simulated = run_simulated(sim, out / "simulated")
        summary["simulated"] = simulated
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if summary["config"].get("plots", True):
        plot_scaling(out, summary["ratios"], simulated)
    for line in summary["ratios"]["verdict"]:
        print(line)
    if simulated:
        for r in simulated["dispatch_overhead"]:
            print(f"simulated: {r['replicas']:4d} replicas  {r['us_per_sample']:8.1f} us/sample")
        p = simulated["planner"]
        print(
            f"simulated: planner {p['plan_seconds']:.2f} s plan + {p['hash_seconds']:.2f} s hash "
            f"for {p['num_transfers']} transfers"
        )
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
