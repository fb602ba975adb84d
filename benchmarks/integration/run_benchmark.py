"""Integration suite: component microbenchmarks against plain baselines, same run, same data.

    python benchmarks/integration/run_benchmark.py --config benchmarks/integration/config.yaml

- rollout: HFEngine tokens/s vs transformers model.generate (same batch, lengths, sampling);
- transfer: a TrainBatch through the learner's chunked gRPC stream vs raw loopback TCP (MB/s);
- weight_sync: planned torch.distributed executor (and naive) vs a raw gloo broadcast;
- reward: samples/s of a real reward service process (and of the in-process scorer).

results/YYYYMMDD_HHMMSS/: summary.json, detailed.log (every timed repeat), profile.svg (py-spy
of this process and its children, when ``profile``), integration.png. Run nothing else meanwhile.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.common.runner import profiled, py_spy, suite_arg_parser  # noqa: E402
from benchmarks.integration.config import IntegrationConfig  # noqa: E402
from benchmarks.integration.timing import DetailedLog  # noqa: E402


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Headline comparisons (ours over the baseline; > 1 means ours is faster)."""
    out: dict[str, Any] = {}
    if "rollout" in results:
        out["engine_over_transformers_tokens_per_s"] = results["rollout"][
            "engine_over_transformers_tokens_per_s"
        ]
    if "transfer" in results:
        out["grpc_over_tcp_mb_per_s"] = results["transfer"]["grpc_over_tcp_mb_per_s"]
        out["grpc_stream_over_tcp_mb_per_s"] = results["transfer"]["grpc_stream_over_tcp_mb_per_s"]
    if "weight_sync" in results:
        out["planner_over_raw_bandwidth"] = results["weight_sync"]["planner_over_raw_bandwidth"]
        out["naive_over_planner_seconds"] = results["weight_sync"]["naive_over_planner_seconds"]
    if "reward" in results:
        out["reward_service_samples_per_s"] = results["reward"]["reward_service"]["samples_per_s"]
        out["reward_service_over_in_process"] = results["reward"][
            "service_over_in_process_samples_per_s"
        ]
    return out


def bars(results: dict[str, Any]) -> list[tuple[str, str, dict[str, float]]]:
    """(title, unit, {label: value}) for each benchmark that ran."""
    out = []
    if "rollout" in results:
        r = results["rollout"]
        out.append(
            (
                "rollout engine",
                "tokens/s",
                {
                    "HFEngine": r["hf_engine"]["tokens_per_s"],
                    "transformers\ngenerate": r["transformers_generate"]["tokens_per_s"],
                },
            )
        )
    if "transfer" in results:
        t = results["transfer"]
        out.append(
            (
                "batch transfer",
                "MB/s",
                {
                    "gRPC\nTrainStep": t["grpc_train_step"]["mb_per_s"],
                    "gRPC\nbyte stream": t["grpc_byte_stream"]["mb_per_s"],
                    "raw TCP": t["raw_tcp"]["mb_per_s"],
                },
            )
        )
    if "weight_sync" in results:
        w = results["weight_sync"]
        out.append(
            (
                "weight sync",
                "MB/s per destination",
                {
                    "planner": w["planner_mb_per_s"],
                    "naive": w["naive"]["effective_gb_per_s_per_dst_rank"] * 1e3,
                    "raw broadcast": w["raw_broadcast_mb_per_s"],
                },
            )
        )
    if "reward" in results:
        rw = results["reward"]
        out.append(
            (
                "reward",
                "samples/s",
                {
                    "service (gRPC)": rw["reward_service"]["samples_per_s"],
                    "in-process": rw["in_process_scorer"]["samples_per_s"],
                },
            )
        )
    return out


def plot(out: Path, results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = bars(results)
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False)
    for ax, (title, unit, values) in zip(axes[0], panels):
        ax.bar(
            list(values),
            list(values.values()),
            color=["tab:blue", "tab:gray", "tab:orange"][: len(values)],
        )
        ax.set(title=title, ylabel=unit)
    fig.tight_layout()
    fig.savefig(out / "integration.png", dpi=100)
    plt.close(fig)


def run_all(cfg: IntegrationConfig, out: Path) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from benchmarks.common.runner import environment
    from hybridflow.config.loader import to_dict

    log = DetailedLog()
    results: dict[str, Any] = {}
    for name in cfg.benchmarks:
        start = time.perf_counter()
        if name == "rollout":
            from benchmarks.integration import rollout_bench
            from hybridflow.models import resolve_model_path

            results[name] = rollout_bench.run(cfg.rollout, resolve_model_path(cfg.model), log)
        elif name == "transfer":
            from benchmarks.integration import transfer_bench

            results[name] = transfer_bench.run(cfg.transfer, log)
        elif name == "weight_sync":
            from benchmarks.integration import weight_sync_bench

            results[name] = weight_sync_bench.run(cfg.weight_sync, log)
        else:
            from benchmarks.integration import reward_bench

            results[name] = reward_bench.run(cfg.reward, log, out)
        results[name]["bench_wall_s"] = time.perf_counter() - start
        print(f"[{name}] done in {results[name]['bench_wall_s']:.1f} s", file=sys.stderr)
    log.write(out / "detailed.log")
    summary = {
        "suite": cfg.suite,
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "benchmarks": results,
        "ratios": ratios(results),
        **environment(),
        "config": to_dict(cfg),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if cfg.plots:
        plot(out, results)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = suite_arg_parser(
        "benchmarks/integration/config.yaml",
        __doc__,
        set_help="override a suite setting, e.g. --set rollout.repeats=2",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="write here instead of a new results/<timestamp>/ (used under py-spy)",
    )
    args = parser.parse_args(argv)
    from hybridflow.config.loader import load_config

    cfg = load_config(IntegrationConfig, args.config, args.set)
    if args.out_dir is not None:
        out = args.out_dir
    else:
        out = args.results / time.strftime("%Y%m%d_%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    spy = py_spy()
    if cfg.profile and args.out_dir is None and spy is not None:
        # Re-run this script under py-spy (children included), writing into the same dir.
        script = [sys.executable, str(Path(__file__).resolve()), "--config", str(args.config)]
        cmd = profiled(spy, out / "profile.svg", [*script, "--out-dir", str(out)])
        for override in args.set:
            cmd += ["--set", override]
        print(f"[integration] {' '.join(cmd)}", file=sys.stderr)
        code = subprocess.run(cmd, cwd=os.getcwd()).returncode
        if code == 0 and not (out / "summary.json").exists():
            code = 1  # py-spy does not always pass the child's failure on
        print(f"results: {out}", file=sys.stderr)
        return code
    summary = run_all(cfg, out)
    print(json.dumps({"ratios": summary["ratios"]}, indent=2))
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
