"""Throughput suite against the stored baseline (benchmarks/baselines/cpu-2core.json).

Runs the shipped throughput suite (minutes) and fails on any speed figure more than 25 %
below, or peak memory above its spread-sized tolerance over, the stored figures (the
tolerances live in the baseline file). A run from another environment (another lock file or
hardware) is skipped with the reason, not failed. Run it on an otherwise idle machine:

    python -m pytest -m slow tests/e2e/test_benchmark_regression.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.baselines.compare import compare, not_comparable
from benchmarks.common.runner import lock_hash

REPO = Path(__file__).resolve().parents[2]
BASELINE = REPO / "benchmarks" / "baselines" / "cpu-2core.json"


@pytest.mark.slow
def test_throughput_suite_within_baseline_tolerance(tmp_path: Path) -> None:
    baseline = json.loads(BASELINE.read_text())
    if not baseline["figures"]:
        pytest.fail(
            f"{BASELINE.name} holds no figures yet: run the throughput suite on an idle "
            "2-core machine and store it with "
            "`python benchmarks/baselines/compare.py results/<run>/summary.json --update`"
        )
    cpus = baseline["hardware"].get("cpus")
    if cpus is not None and os.cpu_count() != cpus:
        pytest.skip(f"baseline is for {cpus} CPUs, this machine has {os.cpu_count()}")
    lock = lock_hash()
    if lock != baseline.get("environment", {}).get("lock_sha256"):
        # Checked before the minutes-long run: the lock alone already decides it.
        pytest.skip(f"not comparable with {BASELINE.name}: the lock file differs")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "throughput" / "run_benchmark.py"),
            "--config",
            str(REPO / baseline["config"]),
            "--results",
            str(tmp_path),
        ],  # fmt: skip
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    reason = not_comparable(summary, baseline)
    if reason:
        pytest.skip(f"not comparable with {BASELINE.name}: {reason}")
    findings = compare(summary, baseline)
    regressions = [str(f) for f in findings if f.regression]
    assert not regressions, "\n".join(regressions) + f"\n(results kept in {run_dir})"
