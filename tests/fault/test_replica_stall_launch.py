"""A SIGSTOPped rollout replica in a real run (issue 27, row 8): deploy/launch.sh with two HF
replicas; one is stopped at step 3 and left stopped. The job completes on the other with the
exactly-once audit clean, and the coordinator's log (in the launcher's output) names the stopped replica's address as
out of dispatch (``coordinator.replica_stall_timeout_s``). Slow: a launch of four services."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.fault.harness import OVERRIDES, PROMPTS_PER_STEP, audit
from tests.fault.procs import find, kill_all, launch, metric_lines, run_args, tree, wait_until

pytestmark = pytest.mark.slow

NUM_STEPS = 20
STALL_S = 6.0


def test_sigstopped_replica_leaves_dispatch_and_the_job_completes(tmp_path: Path) -> None:
    run_dir, output = tmp_path / "run", tmp_path / "launch.out"
    overrides = [o for o in OVERRIDES if not o.startswith("coordinator.num_steps=")]
    proc = launch(
        output,
        *run_args(
            run_dir,
            *overrides,
            f"coordinator.num_steps={NUM_STEPS}",
            "rollout.replicas=2",
            "coordinator.prompts_per_request=2",
            f"coordinator.replica_stall_timeout_s={STALL_S:g}",
        ),
    )
    procs: dict = {}
    try:
        wait_until(lambda: len(metric_lines(run_dir)) >= 3, 600, proc, output)
        procs = tree(proc.pid)
        victim = find(procs, "--replica-index 1")
        os.kill(victim, signal.SIGSTOP)  # left stopped: the launcher SIGCONTs it at the end
        code = proc.wait(timeout=600)
        assert code == 0, output.read_text()
    finally:
        kill_all(procs)
        if proc.poll() is None:
            proc.kill()
    counts = audit(run_dir, NUM_STEPS, PROMPTS_PER_STEP)
    assert counts["lost"] == 0 and counts["doubled"] == 0
    address = (run_dir / "rollout1.addr").read_text().strip()
    text = output.read_text()  # the coordinator logs to the launcher's output
    lines = [x for x in text.splitlines() if "coordinator" in x and "stopped answering" in x]
    assert lines and f"replica 1 ({address})" in lines[0], text[-4000:]
