"""Simulated scale, in this process: what the single controller and the planner cost at sizes
this machine cannot host.

(a) ``dispatch_overhead``: the real coordinator schedule (``TrainingJob`` with one
``ReplicaDispatcher`` thread per replica) driving N instant fake replicas; all services
answer at once, so the wall time is the coordinator's own overhead per sample.
(b) ``planner_cost``: the resharding planner on a 70B-class topology, by running
benchmarks/planner/plan_cost.py (the same script, not a copy) and reading its JSON.

Knows the coordinator's public classes and the planner script's flags; nothing of services.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.scalability.config import SimulatedConfig

REPO = Path(__file__).resolve().parents[2]
PLAN_COST = REPO / "benchmarks" / "planner" / "plan_cost.py"


def dispatch_overhead(cfg: SimulatedConfig, num_replicas: int, run_dir: Path) -> dict[str, Any]:
    """Runs ``cfg.num_steps`` coordinator steps over ``num_replicas`` instant replicas."""
    from benchmarks.scalability.fakes import (
        InstantLearner,
        InstantReward,
        InstantRollout,
        decode,
        fake_prompts,
    )
    from hybridflow.coordinator.config import CoordinatorConfig
    from hybridflow.coordinator.job import TrainingJob
    from hybridflow.coordinator.services import Services

    rollouts = [InstantRollout(cfg.response_tokens) for _ in range(num_replicas)]
    learner = InstantLearner(rollouts)
    services = Services(
        rollouts=list(rollouts),
        reward=InstantReward(),
        learner=learner,
        weight_targets=[f"instant{i}" for i in range(num_replicas)],
        decode=decode,
    )
    job_cfg = CoordinatorConfig(
        num_steps=cfg.num_steps,
        prompts_per_step=cfg.prompts_per_step,
        group_size=cfg.group_size,
        max_staleness=cfg.max_staleness,
        save_checkpoint=False,
        progress=False,
    )
    records = fake_prompts(
        cfg.prompts_per_step * (cfg.num_steps + cfg.max_staleness + 2), cfg.prompt_tokens
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    summary = TrainingJob(job_cfg, services, records, run_dir).run()
    total_s = time.perf_counter() - start
    rows = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    timed = rows[cfg.warmup_steps :]
    wall = timed[-1]["time"] - (timed[0]["time"] - timed[0]["timing_s/step"])
    samples = sum(r["batch/num_samples"] for r in timed)
    return {
        "replicas": num_replicas,
        "steps_timed": len(timed),
        "samples_timed": int(samples),
        "wall_s": wall,
        "us_per_sample": wall / samples * 1e6,
        "samples_per_s": samples / wall,
        "mean_step_s": wall / len(timed),
        "generate_requests": sum(r.num_requests for r in rollouts),
        "prompts_per_request": max(1, cfg.prompts_per_step // num_replicas),
        "total_s_with_startup": total_s,
        "num_steps": summary.num_steps,
        "dropped_stale": summary.num_dropped_stale,
    }


def planner_cost(cfg: SimulatedConfig) -> dict[str, Any]:
    """Plans the 70B-class topology with benchmarks/planner/plan_cost.py; its JSON figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan_cost.json"
        cmd = [
            sys.executable, str(PLAN_COST), "--layers", str(cfg.plan_layers),
            "--num-src", str(cfg.plan_num_src), "--tp", str(cfg.plan_tp),
            "--replicas", str(cfg.plan_replicas), "--bucket-mib", str(cfg.plan_bucket_mib),
            "--out", str(out),
        ]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"plan_cost.py failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(out.read_text())
    result.pop("hardware", None)
    result.pop("versions", None)
    result["layers"] = cfg.plan_layers
    result["process_s"] = elapsed
    return result


def run_simulated(cfg: SimulatedConfig, work_dir: Path) -> dict[str, Any]:
    """Both measurements; ``work_dir`` receives the simulated jobs' run dirs."""
    cfg.validate()
    rows = []
    for n in cfg.replicas:
        row = dispatch_overhead(cfg, n, work_dir / f"replicas_{n}")
        print(
            f"[simulated] {n:4d} instant replicas: {row['us_per_sample']:.1f} us/sample "
            f"({row['samples_per_s']:.0f} samples/s, {row['mean_step_s'] * 1000:.0f} ms/step)",
            file=sys.stderr,
        )
        rows.append(row)
    plan = planner_cost(cfg)
    print(
        f"[simulated] planner: {plan['num_transfers']} transfers, {plan['num_buckets']} buckets "
        f"in {plan['plan_seconds']:.2f} s (hash {plan['hash_seconds']:.2f} s)",
        file=sys.stderr,
    )
    base = rows[0]
    return {
        "config": {k: v for k, v in vars(cfg).items()},
        "dispatch_overhead": rows,
        "dispatch_us_per_sample_growth": {
            str(r["replicas"]): r["us_per_sample"] / base["us_per_sample"] for r in rows
        },
        "planner": plan,
    }
