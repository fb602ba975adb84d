"""Startup and coordinator CPU, measured from outside: before and after, side by side.

Runs the quickstart-sized job through each source tree's own ``deploy/launch.sh`` (same
config, same overrides, same steps) and measures, without relying on anything the job
reports about itself (so an old tree without ``time_to_first_step_s`` works too):

- ``time_to_first_step_s``: from starting launch.sh to the end of the first trained step
  (the ``time`` stamp of the run dir's first metrics.jsonl line);
- ``coordinator_cpu_s_per_1k_samples``: the coordinator process's utime + stime
  (/proc/PID/stat, sampled until it exits; found in the launcher's process tree) per
  1,000 trained samples;
- ``job_cpu_s``: CPU seconds of every process of the job (the launcher and all it started,
  from this process's ``RUSAGE_CHILDREN`` once the launcher has exited), and per 1,000
  samples;
- ``samples_per_s``: trained samples per second between the first and the last step, and
  over the whole launch (``e2e_samples_per_s``);
- where the tree's processes write start-up marks (``<run dir>/startup.jsonl``), the phase
  table of ``phases.py`` per run, and its medians per tree: when each phase ended (seconds
  since the launch) and its CPU seconds, side by side (a tree without marks shows blanks).

    python benchmarks/startup/run_startup.py --baseline-tree ../wt-old [--tree .] \\
        [--steps 40] [--repeats 3] [--set coordinator.prompts_per_step=32 ...]

With ``--baseline-tree`` the trees run alternately (baseline, tree, baseline, ...) and the
report gives the medians and ratios tree / baseline. Each tree runs with its own
``.venv/bin/python`` when it has one, else this Python. Run nothing else on the machine
meanwhile. Writes ``results/startup_YYYYMMDD_HHMMSS/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.common.config import without_evaluation  # noqa: E402
from benchmarks.startup.phases import phase_rows  # noqa: E402
from hybridflow.deploy.launcher import process_tree  # noqa: E402

CONFIG = "deploy/configs/quickstart.yaml"
METRICS = (
    "time_to_first_step_s",
    "coordinator_cpu_s_per_1k_samples",
    "job_cpu_s_per_1k_samples",
    "coordinator_cpu_s",
    "job_cpu_s",
    "samples_per_s",
    "e2e_samples_per_s",
    "launch_wall_s",
)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def is_coordinator(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"hybridflow.main.coordinator" in argv and b"run" in argv


def python_for(tree: Path) -> str:
    venv = tree / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def run_once(
    tree: Path, run_dir: Path, overrides: list[str], timeout_s: float, poll_s: float
) -> dict[str, Any]:
    """One launch of ``tree``'s launch.sh into ``run_dir``, measured from outside."""
    cmd = [str(tree / "deploy" / "launch.sh"), "--config", CONFIG, "--run-dir", str(run_dir)]
    for override in [*without_evaluation(tree), *overrides]:  # the first step's start alone
        cmd += ["--set", override]
    env = dict(os.environ, PYTHON=python_for(tree), PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    env.pop("HYBRIDFLOW_TOKEN", None)  # each run makes its own
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall_start = time.time()
    start = time.monotonic()
    log_path = run_dir.with_suffix(".log")
    coordinator_pid: int | None = None
    coordinator_cpu = 0.0
    with log_path.open("w") as log:
        launcher = subprocess.Popen(
            cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            while launcher.poll() is None:
                if time.monotonic() - start > timeout_s:
                    raise TimeoutError(f"{tree}: not done after {timeout_s:.0f}s; see {log_path}")
                if coordinator_pid is None:
                    found = [p for p in process_tree(launcher.pid)[1:] if is_coordinator(p)]
                    coordinator_pid = found[0] if found else None
                if coordinator_pid is not None:
                    cpu = cpu_seconds(coordinator_pid)
                    coordinator_cpu = cpu if cpu is not None else coordinator_cpu
                time.sleep(poll_s)  # another process's progress: nothing local to wait on
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, 15)  # its lifeline ends every process it started
                launcher.wait()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if launcher.returncode != 0:
        raise RuntimeError(f"{tree}: launch.sh exited with {launcher.returncode}; see {log_path}")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    lines = [m for m in lines if not any(k.startswith("eval/") for k in m)]  # not an eval line
    resolved = _read_yaml(run_dir / "config.yaml")["coordinator"]
    per_step = int(resolved["prompts_per_step"]) * int(resolved["group_size"])
    samples = per_step * len(lines)
    job_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    span = lines[-1]["time"] - lines[0]["time"]
    result = {
        "tree": str(tree),
        "run_dir": str(run_dir),
        "num_steps": len(lines),
        "num_samples": samples,
        "time_to_first_step_s": lines[0]["time"] - wall_start,
        "coordinator_cpu_s": coordinator_cpu,
        "coordinator_cpu_s_per_1k_samples": 1000 * coordinator_cpu / samples,
        "job_cpu_s": job_cpu,
        "job_cpu_s_per_1k_samples": 1000 * job_cpu / samples,
        "samples_per_s": per_step * (len(lines) - 1) / span if span > 0 else float("nan"),
        "e2e_samples_per_s": samples / wall,
        "launch_wall_s": wall,
    }
    try:
        result["phases"] = phase_rows(run_dir)
    except ValueError:  # a tree from before the start-up marks
        result["phases"] = []
    summary = run_dir / "summary.json"
    if summary.is_file():  # what the job says of itself, as a cross-check
        reported = json.loads(summary.read_text())
        for key in ("coordinator_cpu_s", "time_to_first_step_s"):
            if key in reported:
                result[f"reported_{key}"] = reported[key]
    return result


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    return dict(yaml.safe_load(path.read_text()))


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {m: statistics.median(r[m] for r in runs) for m in METRICS}


def phase_medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per ``process/phase``: the median of when it ended (``at_s``), of its wall and of its
    CPU seconds over the runs that logged it."""
    values: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for row in run.get("phases", []):
            cell = values.setdefault(f"{row['process']}/{row['phase']}", {})
            for key in ("at_s", "wall_s", "cpu_s"):
                if row[key] is not None:
                    cell.setdefault(key, []).append(row[key])
    return {
        name: {k: statistics.median(v) if v else None for k, v in cell.items()}
        for name, cell in values.items()
    }


def format_phases(report: dict[str, Any], labels: list[str]) -> str:
    """The phase medians of every tree side by side: ended at (s since launch) and CPU-s."""
    tables = report["phase_medians"]
    names = list(dict.fromkeys(n for label in labels for n in tables[label]))
    if not names:
        return ""

    def cell(label: str, name: str, key: str) -> str:
        value = tables[label].get(name, {}).get(key)
        return f"{value:9.2f}" if value is not None else f"{'':9}"

    head = "".join(f"{label + ' at_s':>16}{'cpu_s':>9}" for label in labels)
    lines = [f"{'phase (medians)':36}{head}"]
    for name in names:
        row = "".join(f"{'':7}{cell(lb, name, 'at_s')}{cell(lb, name, 'cpu_s')}" for lb in labels)
        lines.append(f"{name:36}{row}")
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "",
    )
    return {"cpu": cpu, "cpus": os.cpu_count(), "python": sys.version.split()[0]}


def commit_of(tree: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True)
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", default=str(REPO), help="source tree to measure (default: this)")
    parser.add_argument("--baseline-tree", help="source tree to compare against (e.g. old commit)")
    parser.add_argument("--steps", type=int, default=40, help="trained steps per run")
    parser.add_argument("--repeats", type=int, default=1, help="runs per tree (medians)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per run")
    parser.add_argument("--poll-s", type=float, default=0.05, help="CPU sampling interval")
    parser.add_argument("--out", help="results dir (default results/startup_<timestamp>)")
    args = parser.parse_args(argv)

    out = Path(args.out or REPO / "results" / time.strftime("startup_%Y%m%d_%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    overrides = [f"coordinator.num_steps={args.steps}", *args.set]
    trees = {"tree": Path(args.tree).resolve()}
    if args.baseline_tree:
        trees = {"baseline": Path(args.baseline_tree).resolve(), **trees}
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    for i in range(args.repeats):
        for label, tree in trees.items():  # alternating: drift hits both alike
            result = run_once(tree, out / f"{label}_{i}", overrides, args.timeout_s, args.poll_s)
            runs[label].append(result)
            print(
                f"[{label} {i}] first step {result['time_to_first_step_s']:.1f}s  coordinator "
                f"{result['coordinator_cpu_s_per_1k_samples']:.2f} CPU-s/1k samples  job "
                f"{result['job_cpu_s']:.1f} CPU-s  {result['samples_per_s']:.1f} samples/s",
                file=sys.stderr,
            )
    report: dict[str, Any] = {
        "environment": environment(),
        "overrides": overrides,
        "trees": {label: {"path": str(t), "commit": commit_of(t)} for label, t in trees.items()},
        "runs": runs,
        "medians": {label: medians(r) for label, r in runs.items()},
        "phase_medians": {label: phase_medians(r) for label, r in runs.items()},
    }
    if "baseline" in trees:
        old, new = report["medians"]["baseline"], report["medians"]["tree"]
        report["ratios_tree_over_baseline"] = {
            m: new[m] / old[m] if old[m] else float("nan") for m in METRICS
        }
    (out / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    labels = list(trees)
    print(f"{'metric':36}" + "".join(f"{label:>14}" for label in labels) + "     ratio")
    for m in METRICS:
        row = f"{m:36}" + "".join(f"{report['medians'][lb][m]:14.3f}" for lb in labels)
        if "ratios_tree_over_baseline" in report:
            row += f"{report['ratios_tree_over_baseline'][m]:10.3f}"
        print(row)
    phases = format_phases(report, labels)
    if phases:
        print(phases)
    print(f"results: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
