"""The coordinator's start under the launcher: time to the first trained step counts from
the launch, and the services' addresses arrive on stdin after the coordinator prepared."""

import io
import json
import time

import pytest

from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.services import Services
from hybridflow.main.coordinator_run import LAUNCH_TIME_ENV, launch_time, read_address_overrides

from .fakes import FakeLearner, FakeReward, FakeRollout, records


def _job(tmp_path, num_steps):  # type: ignore[no-untyped-def]
    rollouts = [FakeRollout()]
    svc = Services(
        rollouts, FakeReward(), FakeLearner(rollouts), ["r0"], decode=lambda ids: str(ids)
    )
    cfg = CoordinatorConfig(num_steps=num_steps, prompts_per_step=2, group_size=2, progress=False)
    return TrainingJob(cfg, svc, records(8), tmp_path)


def test_time_to_first_step_counts_from_the_launch_time(tmp_path):
    job = _job(tmp_path, num_steps=2)
    job.launch_time = time.time() - 100.0  # a launch 100 s ago: services took their time
    before_run = time.time()
    summary = job.run()
    assert summary.time_to_first_step_s is not None
    # The first step ended after run() began and before it returned.
    assert 100.0 + (before_run - time.time()) <= summary.time_to_first_step_s
    assert summary.time_to_first_step_s <= time.time() - job.launch_time
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["time_to_first_step_s"] == summary.time_to_first_step_s


def test_no_trained_step_no_time(tmp_path):
    job = _job(tmp_path, num_steps=2)
    job.control.stop()  # stop before the first step
    assert job.run().time_to_first_step_s is None


def test_launch_time_comes_from_the_launcher_else_this_process():
    assert launch_time(5.0, {LAUNCH_TIME_ENV: "1.5"}) == 1.5
    assert launch_time(5.0, {}) == 5.0
    assert launch_time(5.0, {LAUNCH_TIME_ENV: "soon"}) == 5.0


def test_addresses_are_one_json_line_of_overrides():
    line = json.dumps(["coordinator.reward_address=127.0.0.1:1"]) + "\n"
    assert read_address_overrides(io.StringIO(line)) == ["coordinator.reward_address=127.0.0.1:1"]
    with pytest.raises(ValueError, match="closed stdin"):
        read_address_overrides(io.StringIO(""))
    with pytest.raises(ValueError, match="JSON list"):
        read_address_overrides(io.StringIO('{"a": 1}\n'))
