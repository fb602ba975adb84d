"""Run directories are private (issue 27, row 11): the run dir, the coordinator's files
(checkpoints, logs, the resolved config) and the learner's DCP train state are 0700 / 0600
by default and 0750 / 0640 with ``deploy.group_readable``; never readable by others."""

from __future__ import annotations

import os
import stat
from dataclasses import asdict
from pathlib import Path

import pytest

from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.services import Services
from hybridflow.deploy.run_dir_mode import prepare_run_dir
from hybridflow.job_config import load_job_config
from tests.unit.coordinator.fakes import FakeLearner, FakeReward, FakeRollout, records


@pytest.fixture(autouse=True)
def keep_umask():  # type: ignore[no-untyped-def]
    old = os.umask(0o022)
    yield
    os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        out[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return out


def _train_with_checkpoints(run_dir: Path, group_readable: bool) -> None:
    """What the coordinator writes (the learner's train state: tests/unit/learner/test_train_state_private.py)."""

    job = load_job_config(
        None,
        [
            "coordinator.num_steps=2",
            "coordinator.prompts_per_step=2",
            "coordinator.group_size=2",
            "coordinator.checkpoint_every=1",
            "coordinator.progress=false",
            f"deploy.group_readable={str(group_readable).lower()}",
        ],
    )
    prepare_run_dir(run_dir, job.deploy.group_readable)
    rollouts = [FakeRollout()]
    root = run_dir / "checkpoints"
    svc = Services(rollouts, FakeReward(), FakeLearner(rollouts, root), ["r0"], lambda ids: "x")
    TrainingJob(
        job.coordinator,
        svc,
        records(4),
        run_dir,
        checkpoint_root=root,
        resolved_config=asdict(job),
    ).run()


@pytest.mark.parametrize(
    ("group_readable", "dirs", "files"), [(False, 0o700, 0o600), (True, 0o750, 0o640)]
)
def test_run_dir_checkpoints_and_logs_modes(
    tmp_path: Path, group_readable: bool, dirs: int, files: int
) -> None:
    run_dir = tmp_path / "runs" / "run"
    _train_with_checkpoints(run_dir, group_readable)
    modes = _modes(run_dir)
    for name in ("metrics.jsonl", "trained.jsonl", "events.jsonl", "summary.json"):
        assert modes[name] == files, name
    assert modes["checkpoints/step_00000002/config.json"] == files
    assert modes["checkpoints/step_00000002/coordinator.json"] == files
    for name, mode in modes.items():
        assert mode == (dirs if (run_dir / name).is_dir() else files), (name, oct(mode))


def test_a_looser_run_dir_is_closed_on_the_next_launch(tmp_path: Path) -> None:
    run_dir = tmp_path / "old"
    run_dir.mkdir(mode=0o755)
    os.chmod(run_dir, 0o755)
    prepare_run_dir(run_dir, group_readable=False)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
