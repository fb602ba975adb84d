"""The environment service as the launcher runs it: a real process started from a job
config, killed, and restarted on its address by ``ServiceGroup.restart``; the client counts
the episode the dead process held as unavailable (to restart from its task) and new
episodes run on the new process. SIGTERM drains it and it exits 0, also while a hung
environment's thread still runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridflow.deploy.launcher import ServiceGroup, ServiceProcess
from hybridflow.envs.base import Task
from hybridflow.envs.runner import EnvironmentUnavailable, EpisodeError
from hybridflow.job_config import load_job_config
from hybridflow.rpc.channel import wait_healthy
from hybridflow.rpc.config import ChannelConfig
from hybridflow.services.environment.client import EnvironmentServiceClient
from tests.helpers import wait_for_file

REPO = Path(__file__).resolve().parents[2]
GUESS = "tests.unit.envs.test_environment_service:Guess"
CHANNEL = ChannelConfig(timeout_s=30, retries=0, initial_backoff_s=0.05)


def test_killed_service_restarts_on_its_address_and_episodes_are_counted_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        f"environment:\n  envs: [{GUESS}]\n  max_episodes: 4\n"
        f"coordinator:\n  multi_turn:\n    env: {GUESS}\n"
    )
    path = [str(REPO), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, path)))  # the test env class
    cmd = [sys.executable, "-m", "hybridflow.main.environment"]
    port_file, log = tmp_path / "environment.addr", tmp_path / "environment.log"
    with log.open("wb") as out:
        first = subprocess.Popen(
            [*cmd, "--config", str(config), "--port-file", str(port_file)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    group = ServiceGroup(load_job_config(config), str(config), [], tmp_path)
    client = None
    try:
        wait_for_file(port_file, first)
        address = port_file.read_text().strip()
        wait_healthy(address, 60)
        client = EnvironmentServiceClient(address, CHANNEL)
        client.reset("in-flight", GUESS, Task("guess", "5"))
        first.kill()
        first.wait(timeout=30)
        with pytest.raises(EnvironmentUnavailable):
            client.step("in-flight", "5")

        proc = ServiceProcess("environment", first, port_file, log, address, cmd)
        group.processes.append(proc)
        second = group.restart(proc)
        deadline = time.monotonic() + 60
        while not group.check_ready(second):
            assert second.popen.poll() is None, second.log_path.read_text()
            assert time.monotonic() < deadline, "the restarted service never served"
            time.sleep(0.1)  # another process's start: nothing local to wait on
        assert second.address == address  # clients reconnect without a new address
        with pytest.raises(EnvironmentUnavailable, match="restarted"):
            client.step("in-flight", "5")  # the new process never held it
        client.reset("again", GUESS, Task("guess", "5"))
        assert client.step("again", "5").done

        second.popen.send_signal(signal.SIGTERM)
        assert second.popen.wait(timeout=30) == 0
        assert "stopped" in second.log_path.read_text()
    finally:
        if client is not None:
            client.shutdown()
        group.stop(grace_s=5)
        if first.poll() is None:
            first.kill()
            first.wait()


def test_a_hung_environment_does_not_keep_the_process_from_stopping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hangs = "tests.unit.envs.test_environment_service:Hangs"  # never released in that process
    config = tmp_path / "job.yaml"
    config.write_text(
        f"environment:\n  envs: [{hangs}]\n  step_timeout_s: 0.5\n"
        f"coordinator:\n  multi_turn:\n    env: {hangs}\n"
    )
    path = [str(REPO), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, path)))
    port_file = tmp_path / "environment.addr"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hybridflow.main.environment", "--config", str(config)]
        + ["--port-file", str(port_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_file(port_file, proc)
        address = port_file.read_text().strip()
        wait_healthy(address, 60)
        client = EnvironmentServiceClient(address, CHANNEL)
        client.reset("stuck", hangs, Task("p"))
        with pytest.raises(EpisodeError, match="step_timeout_s"):
            client.step("stuck", "go")
        assert client.info().num_hung == 1
        client.shutdown()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
