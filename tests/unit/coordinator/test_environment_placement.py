"""Where a multi-turn job's episodes step: in the environment service the launcher (or the
Slurm plan) started, else in the coordinator, which then says so."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hybridflow.job_config import load_job_config
from hybridflow.main import coordinator_run as run

REPO = Path(__file__).resolve().parents[3]
GUESS = REPO / "deploy/configs/guess-number.yaml"


def test_listed_environment_classes_without_their_service_are_said_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    job = load_job_config(GUESS, [])
    assert job.environment.enabled and not job.coordinator.environment_address
    with caplog.at_level(logging.WARNING, logger="coordinator"):
        environments = run._environments(job)
    assert environments is not None  # in process: the job still runs
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "hybridflow.envs.guess_number:GuessNumberEnv" in warning
    assert "no environment service was started" in warning


def test_no_warning_when_the_job_lists_no_classes(caplog: pytest.LogCaptureFixture) -> None:
    # In-process episodes asked for (environment.envs empty): nothing to warn about.
    job = load_job_config(GUESS, ["environment.envs=[]"])
    with caplog.at_level(logging.WARNING, logger="coordinator"):
        assert run._environments(job) is not None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
