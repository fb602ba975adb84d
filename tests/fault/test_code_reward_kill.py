"""A code RL run survives its reward service's death mid-step: SIGKILL the reward service
while its sandbox pool runs the policy's programs; the programs die with it (nothing of the
sandbox is left), the launcher restarts the service on its address, the coordinator's reward
client retries the cut Score call (its channel retries UNAVAILABLE) and the new process scores
that request again, and the run completes with 0 prompts lost and 0
trained twice."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from hybridflow.coordinator.metrics import read_step_lines
from tests.fault.harness import (
    PROCESS_OF,
    _sets,
    _wait_gone,
    alive,
    audit,
    finish,
    launch,
    process_tree,
    trained_steps,
)

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)"
)
NUM_STEPS = 10
CODE = (
    "--config",
    "deploy/configs/code.yaml",
    *_sets(  # the harness's overrides (checkpoint_every=2, ...) and these
        (
            f"coordinator.num_steps={NUM_STEPS}",
            "coordinator.eval.sets=[]",
        )
    ),
)


def test_reward_service_killed_while_programs_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    deadline = time.monotonic() + 300
    proc = launch(run_dir, *CODE, "--run-dir", str(run_dir))
    seen: set[int] = set()
    try:
        while True:  # a step trained, and the reward service inside a sandboxed run
            assert proc.poll() is None, "the run ended before the kill"
            assert time.monotonic() < deadline, "no sandboxed run seen in time"
            tree = process_tree(proc.pid)
            seen.update(tree)
            reward = next((p for p, c in tree.items() if PROCESS_OF["reward"] in c), None)
            sandboxed = (
                [p for p in process_tree(reward) if "bwrap" in tree.get(p, "")] if reward else []
            )
            if trained_steps(run_dir) >= 2 and sandboxed:
                break  # a sandboxed run exists only inside a Score call: one is cut now
            time.sleep(0.005)  # another process's state: nothing to wait on locally
        os.kill(reward, signal.SIGKILL)
        _gone(reward, deadline)
        _wait_gone(set(sandboxed), deadline)  # the programs died with the service
        code, output = finish(proc, max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 0, output
    counts = audit(run_dir, NUM_STEPS)
    assert counts["lost"] == 0 and counts["doubled"] == 0
    metrics = read_step_lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, NUM_STEPS + 1))
    assert all(m["reward/num_errors"] == 0 for m in metrics)  # every item really scored
    assert all(
        sum(v for k, v in m.items() if k.startswith("reward/outcome/")) == 1 for m in metrics
    )
    supervisor = [json.loads(x) for x in (run_dir / "supervisor.jsonl").read_text().splitlines()]
    assert any(e["event"] == "restarted" and e["service"].startswith("reward") for e in supervisor)
    _wait_gone(seen, deadline)


def _gone(pid: int, deadline: float) -> bool:
    while alive(pid):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return True
