"""Throughput of one launched job at 1, 2, 3 and again 1 rollout replicas, grown and shrunk
while it trains (``hybridflow-coordinator scale``), with the audit of what it trained.

    python benchmarks/scale/run_scale.py [--config deploy/configs/quickstart.yaml]
        [--steps-per-size 15] [--out benchmarks/results/scale_<time>]

It launches the job (``deploy/launch.sh``, one replica), starts two more rollout services
from the run's own resolved config and token (``python -m hybridflow.main.rollout``), then:
1 replica for ``--steps-per-size`` steps; adds one and waits until it serves (its catch-up
weight sync passed its check); the same at 2; adds the third; then drains the two added ones
and measures 1 again. Each size's throughput is counted from the run's ``events.jsonl``
(train steps after the replica set settled), so the scale operations themselves are not in
it. Writes ``results.json`` and prints one table; the audit fails the run on a prompt trained
twice or lost. On a 2-core machine more replicas share the same two cores: the table says what
the schedule does with them, not what more machines would give.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hybridflow.coordinator.client import control_call, scale_call  # noqa: E402

WAIT_S = 600.0


def _wait_file(path: Path, proc: subprocess.Popen[bytes], what: str) -> str:
    deadline = time.monotonic() + WAIT_S
    while not path.is_file() or not path.read_text().strip():
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited ({proc.returncode}) before writing {path}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: no {path} after {WAIT_S:g}s")
        time.sleep(0.5)
    return path.read_text().strip()


def _wait_until(address: str, what: str, done) -> object:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while True:
        status = control_call(address, "status", timeout_s=10)
        if done(status):
            return status
        if status.state in ("done", "failed") or time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}: {status}")
        time.sleep(0.5)


def _states(status) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {r.address: r.state for r in status.replicas}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "deploy/configs/quickstart.yaml"))
    parser.add_argument("--steps-per-size", type=int, default=15)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    out = Path(args.out or ROOT / "benchmarks/results" / time.strftime("scale_%Y%m%d_%H%M%S"))
    run_dir = out / "run"
    out.mkdir(parents=True, exist_ok=True)
    sets = [
        "coordinator.num_steps=100000",  # ended by this script's stop
        "coordinator.eval.sets=[]",  # held-out evaluations would land inside a size's steps
        "coordinator.progress=false",
    ]
    launch = [str(ROOT / "deploy/launch.sh"), "--config", args.config, "--run-dir", str(run_dir)]
    for s in sets:
        launch += ["--set", s]
    log = (out / "launch.log").open("wb")
    launcher = subprocess.Popen(launch, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    extras: list[subprocess.Popen[bytes]] = []
    try:
        address = _wait_file(run_dir / "coordinator.addr", launcher, "the launcher")
        env = {**os.environ, "HYBRIDFLOW_TOKEN": (run_dir / "token").read_text().strip()}
        os.environ["HYBRIDFLOW_TOKEN"] = env["HYBRIDFLOW_TOKEN"]  # for the control calls
        added = []
        for i in (1, 2):
            port_file = out / f"extra{i}.addr"
            extras.append(
                subprocess.Popen(
                    [sys.executable, "-m", "hybridflow.main.rollout", "--config",
                     str(run_dir / "config.yaml"), "--port-file", str(port_file),
                     "--set", f"rollout.seed={i}"],
                    cwd=ROOT, env=env, stdout=(out / f"extra{i}.log").open("wb"),
                    stderr=subprocess.STDOUT,
                )
            )  # fmt: skip
            added.append(_wait_file(port_file, extras[-1], f"extra replica {i}"))
        first = _wait_until(address, "the first step", lambda s: s.step >= 1 and s.replicas)
        launched = first.replicas[0].address  # type: ignore[attr-defined]
        phases = []

        def measure(size: int) -> None:
            start = control_call(address, "status", timeout_s=10).step
            _wait_until(
                address, f"{args.steps_per_size} steps at {size}",
                lambda s: s.step >= start + args.steps_per_size,
            )  # fmt: skip
            phases.append({"replicas": size, "first_step": start + 1,
                           "last_step": start + args.steps_per_size})  # fmt: skip
            print(f"{size} replica(s): steps {start + 1}-{start + args.steps_per_size}", flush=True)

        def scale(add: list[str], remove: list[str], want: dict[str, str]) -> float:
            t0 = time.monotonic()
            scale_call(address, add, remove, timeout_s=10)
            _wait_until(
                address, f"replicas {want}",
                lambda s: all(_states(s).get(a) == w for a, w in want.items()),
            )  # fmt: skip
            return time.monotonic() - t0

        measure(1)
        join_s = [scale([added[0]], [], {added[0]: "serving"})]
        measure(2)
        join_s.append(scale([added[1]], [], {added[1]: "serving"}))
        measure(3)
        drain_s = scale([], added, {a: "removed" for a in added})
        measure(1)
        control_call(address, "stop", timeout_s=10)
        launcher.wait(timeout=WAIT_S)
    finally:
        for proc in [*extras, launcher]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*extras, launcher]:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    results = _results(run_dir, phases, launched, added, join_s, drain_s)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    _print(results, out)
    return 0


def _results(run_dir, phases, launched, added, join_s, drain_s):  # type: ignore[no-untyped-def]
    """Per size: steps/s and samples/s over its train events; the audit of trained.jsonl."""
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    trains = {e["step"]: e for e in events if e["kind"] == "train"}
    samples = {e["step"]: e["num_samples"] for e in trains.values()}
    for p in phases:
        steps = range(p["first_step"], p["last_step"] + 1)
        # From the end of the step before the phase to the end of its last step.
        t0 = trains[p["first_step"] - 1]["start"] + trains[p["first_step"] - 1]["duration_s"]
        t1 = trains[p["last_step"]]["start"] + trains[p["last_step"]]["duration_s"]
        p["seconds"] = round(t1 - t0, 3)
        p["steps_per_s"] = round(len(steps) / (t1 - t0), 3)
        p["samples_per_s"] = round(sum(samples[s] for s in steps) / (t1 - t0), 1)
    trained = [json.loads(x) for x in (run_dir / "trained.jsonl").read_text().splitlines()]
    seqs = Counter(r["seq"] for r in trained)
    doubled = sorted(s for s, n in seqs.items() if n > 1)
    final = max((run_dir / "checkpoints").glob("step_*"))  # the stop's checkpoint
    pending = {q for _, _, q in json.loads((final / "coordinator.json").read_text())["pending"]}
    handed_out = set(seqs) | pending
    lost = sorted(set(range(max(handed_out) + 1)) - handed_out)
    return {
        "launched_replica": launched,
        "added_replicas": added,
        "phases": phases,
        "join_s": [round(s, 2) for s in join_s],
        "drain_s": round(drain_s, 2),
        "trained_groups": len(trained),
        "doubled": doubled,
        "pending_at_end": len(pending),
        "lost": lost,
    }


def _print(results, out: Path) -> None:  # type: ignore[no-untyped-def]
    print(f"\nresults: {out / 'results.json'}")
    print("| replicas | steps | seconds | steps/s | samples/s |")
    print("|---:|---|---:|---:|---:|")
    for p in results["phases"]:
        print(
            f"| {p['replicas']} | {p['first_step']}-{p['last_step']} | {p['seconds']} | "
            f"{p['steps_per_s']} | {p['samples_per_s']} |"
        )
    print(
        f"join (scale call to serving): {results['join_s']} s; drain of two: "
        f"{results['drain_s']} s; trained groups {results['trained_groups']}, doubled "
        f"{len(results['doubled'])}, lost {len(results['lost'])}, pending at the stop "
        f"{results['pending_at_end']}"
    )
    if results["doubled"] or results["lost"]:
        raise SystemExit(f"doubled {results['doubled'][:10]}, lost {results['lost'][:10]}")


if __name__ == "__main__":
    sys.exit(main())
