"""Stalled-replica benchmark (issue 27, row 8): steps/s of a run whose second rollout replica is
SIGSTOPped, against a one-replica run, side by side in one invocation.

1. one replica: deploy/launch.sh (quickstart config, tiny model) with ``rollout.replicas=1``;
2. stalled: the same with ``rollout.replicas=2``; replica 1 is SIGSTOPped once
   ``--stop-at-step`` steps are trained and stays stopped (the launcher SIGCONTs it when the
   run ends).
Steps are timed by polling each run's metrics.jsonl (resolution ~0.05 s). Reported per run:
steps/s over the steps after ``--stop-at-step`` (the stall's detection included) and over
the steps after the replica left dispatch (steady state); ``ratio`` = stalled / one replica
over the same steps, target >= 0.8. Writes ``--out``/summary.json with the hardware, the
versions and the commit. Nothing else may run on the machine meanwhile.

    .venv/bin/python benchmarks/overload/run_stalled_replica.py --out results/stalled_replica
    (smoke: --steps 8 --stop-at-step 2)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "deploy" / "launch.sh"


def _children(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                kids = [int(c) for c in (task / "children").read_text().split()]
                out += kids
                todo += kids
        except OSError:
            continue
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _num_lines(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except OSError:
        return 0


def run_one(
    out: Path, name: str, replicas: int, steps: int, stop_at: int | None, stall_s: float
) -> dict[str, Any]:
    """One launch; returns its step completion times (seconds since launch) and its log."""
    run_dir = out / name
    overrides = [
        "coordinator.progress=false",
        "coordinator.save_checkpoint=false",
        f"coordinator.num_steps={steps}",
        f"rollout.replicas={replicas}",
        f"coordinator.replica_stall_timeout_s={stall_s:g}",
    ]
    args = [str(LAUNCH), "--config", "deploy/configs/quickstart.yaml", "--run-dir", str(run_dir)]
    for o in overrides:
        args += ["--set", o]
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    env.pop("HYBRIDFLOW_TOKEN", None)
    log = out / f"{name}.out"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    start = time.monotonic()
    times: list[float] = []
    stopped_pid = None
    left_at_step = None  # steps trained when the coordinator logged the replica out
    with log.open("rb") as reader:
        while True:
            running = proc.poll() is None
            done = _num_lines(run_dir / "metrics.jsonl")
            while len(times) < done:
                times.append(time.monotonic() - start)
            if stop_at is not None and stopped_pid is None and done >= stop_at:
                victims = [p for p in _children(proc.pid) if "--replica-index 1" in _cmdline(p)]
                if victims:
                    stopped_pid = victims[0]
                    os.kill(stopped_pid, signal.SIGSTOP)
            chunk = reader.read()
            if left_at_step is None and b"stopped answering" in chunk:
                left_at_step = done
            if not running:
                break
            time.sleep(0.05)  # another process's file: nothing local to wait on
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{name}: launch exited with {proc.returncode}:\n{text[-3000:]}")
    return {"times": times, "stopped_pid": stopped_pid, "left_at_step": left_at_step}


def steps_per_s(times: list[float], first: int, last: int) -> float:
    """Steps ``first+1 .. last`` (1-based) per second: between the ends of steps first and last."""
    if last <= first or last > len(times):
        return float("nan")
    return (last - first) / (times[last - 1] - times[first - 1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--stop-at-step", type=int, default=5)
    parser.add_argument("--stall-timeout-s", type=float, default=20.0)
    parser.add_argument("--out", default="results/stalled_replica")
    args = parser.parse_args(argv)
    out = Path(args.out) / time.strftime("%Y%m%d_%H%M%S")
    out.mkdir(parents=True)
    load_before = os.getloadavg()[0]
    one = run_one(out, "one_replica", 1, args.steps, None, args.stall_timeout_s)
    stalled = run_one(
        out, "two_replicas_one_stopped", 2, args.steps, args.stop_at_step, args.stall_timeout_s
    )
    k, n = args.stop_at_step, args.steps
    left = stalled["left_at_step"]
    after = max(k, (left or k) + 1)
    figures = {
        "one_replica_steps_per_s": steps_per_s(one["times"], k, n),
        "stalled_steps_per_s": steps_per_s(stalled["times"], k, n),
        "one_replica_steady_steps_per_s": steps_per_s(one["times"], after, n),
        "stalled_steady_steps_per_s": steps_per_s(stalled["times"], after, n),
        "left_dispatch_at_step": left,
        "stalled_replica_logged": left is not None,
    }
    figures["ratio"] = figures["stalled_steps_per_s"] / figures["one_replica_steps_per_s"]
    figures["steady_ratio"] = (
        figures["stalled_steady_steps_per_s"] / figures["one_replica_steady_steps_per_s"]
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    summary = {
        "suite": "stalled_replica",
        "args": vars(args),
        "figures": figures,
        "target_ratio": 0.8,
        "hardware": {"cpu": platform.processor(), "num_cpus": os.cpu_count()},
        "python": platform.python_version(),
        "commit": commit,
        "load_before": load_before,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
