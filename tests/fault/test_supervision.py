"""The launcher supervises its job: real deploy/launch.sh runs with the tiny model, each
with one process killed or stopped mid-run, and no process of the run left afterwards."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.fault.procs import (
    events,
    find,
    kill_all,
    launch,
    metric_lines,
    run_args,
    tree,
    wait_all_gone,
    wait_until,
)

LONG_RUN = ("coordinator.num_steps=100000", "coordinator.prompts_per_step=4")
START_TIMEOUT_S = 240.0  # services and the first step on a busy 2-core machine


def start_and_wait_for_training(tmp_path: Path, *overrides: str):  # type: ignore[no-untyped-def]
    run_dir, output = tmp_path / "run", tmp_path / "launch.out"
    proc = launch(output, *run_args(run_dir, *overrides))
    wait_until(lambda: len(metric_lines(run_dir)) >= 1, START_TIMEOUT_S, proc, output)
    procs = tree(proc.pid)
    # launcher, reward, learner, rollout0, coordinator
    assert len(procs) >= 5, procs
    return proc, run_dir, output, procs


@pytest.mark.parametrize(
    "overrides",
    [(), pytest.param(("learner.topology.nproc_per_node=2",), marks=pytest.mark.slow)],
    ids=["single-learner", "torchrun-2-ranks"],
)
def test_sigkill_launcher_leaves_no_process(tmp_path, overrides):
    proc, run_dir, output, procs = start_and_wait_for_training(tmp_path, *LONG_RUN, *overrides)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # Parent-death signal, then the watchdog's hard exit after its grace (15 s).
        assert not wait_all_gone(procs, timeout_s=60)
    finally:
        kill_all(procs)


def test_sigterm_ends_everything_while_the_coordinator_is_blocked(tmp_path):
    proc, run_dir, output, procs = start_and_wait_for_training(
        tmp_path, *LONG_RUN, "deploy.stop_timeout_s=2"
    )
    rollout = find(procs, "hybridflow.main.rollout")
    try:
        os.kill(rollout, signal.SIGSTOP)  # the coordinator now blocks in an RPC to it
        os.kill(proc.pid, signal.SIGTERM)
        # Bound: stop_timeout_s (2) + the services' stop grace (15) + slack for a busy host.
        proc.wait(timeout=90)
        assert not wait_all_gone(procs, timeout_s=10)
    finally:
        kill_all(procs)
    kinds = [(e["service"], e["event"]) for e in events(run_dir)]
    assert ("coordinator", "sigterm") in kinds, kinds
    text = output.read_text()
    last = text.strip().splitlines()[-1]
    if ("coordinator", "sigkill") in kinds:  # it was blocked: killed after the timeout
        assert proc.returncode == 1, text
        assert last.startswith("coordinator killed: did not stop within 2s"), last
    else:  # it got through its step before the rollout stopped: a clean stop
        assert proc.returncode == 0, text
    assert last.endswith(f"resume with: deploy/launch.sh --resume {run_dir}"), last


def test_sigkill_learner_stops_the_job_with_one_line_and_the_resume_command(tmp_path):
    proc, run_dir, output, procs = start_and_wait_for_training(tmp_path, *LONG_RUN)
    try:
        os.kill(find(procs, "hybridflow.main.learner"), signal.SIGKILL)
        proc.wait(timeout=120)
        assert not wait_all_gone(procs, timeout_s=30)
    finally:
        kill_all(procs)
    text = output.read_text()
    assert proc.returncode == 1, text
    last = text.strip().splitlines()[-1]
    assert last == (
        f"learner exited with code -9 (see {run_dir}/logs/learner.log); "
        f"resume with: deploy/launch.sh --resume {run_dir}"
    ), text
    launcher_lines = [line for line in text.splitlines() if " launch " in line]
    assert not any("Traceback" in line for line in launcher_lines)
    kinds = [(e["service"], e["event"]) for e in events(run_dir)]
    # The coordinator is killed by the supervisor, or it exits on its own first (its learner
    # RPC failed): either way the learner's exit is recorded and named as the job's failure.
    assert ("learner", "exited") in kinds and ("job", "failed") in kinds, kinds


@pytest.mark.slow  # ~25 s; the restart logic itself is covered in tests/unit/deploy
def test_sigkill_reward_restarts_it_on_its_port_and_the_run_completes(tmp_path):
    proc, run_dir, output, procs = start_and_wait_for_training(
        tmp_path, "coordinator.num_steps=20", "coordinator.prompts_per_step=4"
    )
    address = (run_dir / "reward.addr").read_text().strip()
    try:
        os.kill(find(procs, "hybridflow.main.reward"), signal.SIGKILL)
        wait_until(
            lambda: any(e["event"] == "restarted" for e in events(run_dir)), 120, proc, output
        )
        proc.wait(timeout=240)
    finally:
        kill_all(procs)
        kill_all(tree(proc.pid))
    text = output.read_text()
    restarted = [e for e in events(run_dir) if e["event"] == "restarted"]
    assert [(e["service"], e["attempt"], e["address"]) for e in restarted] == [
        ("reward", 1, address)
    ]
    assert (run_dir / "reward.addr").read_text().strip() == address
    assert re.search(r"restarted reward \(pid \d+, attempt 1/3\)", text), text
    assert proc.returncode == 0, text
    assert [m["step"] for m in metric_lines(run_dir)] == list(range(1, 21))
