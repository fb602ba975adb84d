"""The learner's train state (DCP shards, per-rank extras, COMPLETE) gets the run's private
modes from the umask the launcher sets (issue 27, row 11): 0700 directories, 0600 files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hybridflow.deploy.run_dir_mode import prepare_run_dir
from hybridflow.services.learner.config import LearnerConfig
from hybridflow.services.learner.train_state import save_train_state
from hybridflow.services.learner.worker import LearnerWorker


def test_train_state_is_private(tiny_checkpoint: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    old = os.umask(0o022)
    try:
        prepare_run_dir(run_dir, group_readable=False)
        worker = LearnerWorker(LearnerConfig(algorithm="ppo"), tiny_checkpoint)
        save_train_state(worker, run_dir / "checkpoints" / "step_00000001" / "learner")
    finally:
        os.umask(old)
    paths = [run_dir, *run_dir.rglob("*")]
    assert any(p.suffix == ".distcp" for p in paths)
    for path in paths:
        want = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.lstat().st_mode) == want, (path, oct(path.lstat().st_mode))
