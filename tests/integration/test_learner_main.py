"""The learner process's entry point end to end: it serves once its port file is written,
answers the coordinator's questions, and on SIGTERM drains, stops and exits 0; under torchrun
the other rank serves relayed commands and waits for rank 0 on SIGTERM (issue 21: the entry
point in parts, behaviour unchanged)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridflow.job.plan import ranks_command
from hybridflow.job_config import load_job_config
from hybridflow.services.learner.client import GrpcLearnerClient

REPO = Path(__file__).resolve().parents[2]
CONFIG = "deploy/configs/quickstart.yaml"


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"learner exited with {proc.returncode} before serving"
        assert time.monotonic() < deadline, "learner did not write its port file in time"
        time.sleep(0.2)
    return path.read_text().strip()


@pytest.mark.parametrize(
    "overrides", [(), pytest.param(("learner.topology.nproc_per_node=2",), marks=pytest.mark.slow)]
)
def test_the_learner_serves_until_sigterm_then_drains_and_stops(tmp_path, overrides):
    job = load_job_config(CONFIG, list(overrides))
    port_file = tmp_path / "learner.addr"
    cmd = ranks_command(sys.executable, "hybridflow.main.learner", job.learner)
    cmd += ["--config", CONFIG, "--port-file", str(port_file)]
    for override in overrides:
        cmd += ["--set", override]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("HYBRIDFLOW_TOKEN", None)
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        address = _wait_for(port_file, proc, timeout_s=240)
        client = GrpcLearnerClient(address)
        try:
            assert client.needs_greedy_baseline() is False
            assert client.needs_routed_experts() is False
        finally:
            client.close()
        os.killpg(proc.pid, signal.SIGTERM)  # as torchrun's ranks get it: every one at once
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    world = job.learner.topology.nproc_per_node
    ready = (
        f"learner0: learner ready on {address} (world {world}, 0 of them critic ranks, "
        f"{job.learner.algorithm})"
    )
    lines = err.splitlines()
    order = [ready, "signal 15: draining", "hybridflow.rpc.server: stopped"]
    assert all(any(want in line for line in lines) for want in order), err
    found = [next(i for i, line in enumerate(lines) if want in line) for want in order]
    assert found == sorted(found), err
    if world == 1:
        assert proc.returncode == 0, err
    else:  # torchrun itself ends on its SIGTERM; rank 1 waited for rank 0's "shutdown"
        assert "learner1: rank 1 serving relayed commands" in err
        assert "learner1: SIGTERM: waiting for rank 0" in err
