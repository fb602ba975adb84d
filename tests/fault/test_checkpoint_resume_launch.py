"""Issue 27 rows 1, 2: ``deploy/launch.sh --resume`` on a run whose newest checkpoint is
damaged refuses it naming the file, falls back to the previous one, and completes; one whose
checkpoints do not fit the job (``learner.algorithm=ppo`` on a GRPO run) fails at once naming
the critic, instead of hanging until the 120 s deadline. The flipped-bytes case runs in the
default suite (two launches, ~60 s); the other kinds are slow."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.fault.harness import finish, launch, trained_steps
from tests.fault.test_checkpoint_integrity import DAMAGE

SETS = (
    "coordinator.num_steps=4",
    "coordinator.prompts_per_step=8",
    "coordinator.group_size=4",
    "coordinator.data_size=24",
    "coordinator.checkpoint_every=2",
    "coordinator.progress=false",
    "coordinator.save_checkpoint=false",
)
NEWEST = "step_00000004"


def _sets(*sets: str) -> list[str]:
    return [arg for s in sets for arg in ("--set", s)]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-step run with checkpoints at steps 2 and 4 (copied by each test)."""
    run = tmp_path_factory.mktemp("launch") / "run"
    code, out = finish(launch(run, "--run-dir", str(run), *_sets(*SETS)), 600)
    assert code == 0, out
    return run


def _resume_after(finished_run: Path, tmp_path: Path, kind: str) -> tuple[Path, str]:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, symlinks=True)
    damaged = DAMAGE[kind](run / "checkpoints" / NEWEST / "learner")
    code, out = finish(launch(run, "--resume", str(run), *_sets("coordinator.num_steps=6")), 600)
    assert code == 0, out
    refusal = next((line for line in out.splitlines() if "refusing checkpoint step 4" in line), "")
    assert str(damaged) in refusal, out  # the learner's DATA_LOSS, or the coordinator's own
    assert "fell back to checkpoint step 2" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from_step"] == 2 and trained_steps(run) == 6
    return run, out


def test_flipped_bytes_in_the_newest_checkpoint_fall_back_and_complete(finished_run, tmp_path):
    run, _ = _resume_after(finished_run, tmp_path, "16 flipped bytes")
    assert (run / "checkpoints" / f"{NEWEST}.refused").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("kind", [k for k in DAMAGE if k != "16 flipped bytes"])
def test_other_damage_falls_back_and_completes(finished_run, tmp_path, kind):
    run, _ = _resume_after(finished_run, tmp_path, kind)  # asserts the refusal and fallback
    assert (run / "checkpoints" / f"{NEWEST}.refused").is_dir()


@pytest.mark.slow
def test_ppo_on_a_grpo_run_is_refused_at_once_naming_the_key(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, symlinks=True)
    code, out = finish(launch(run, "--resume", str(run), *_sets("learner.algorithm=ppo")), 600)
    assert code != 0
    # The config comparison names the key before any checkpoint is tried (resume_policy);
    # tests/fault/test_checkpoint_integrity.py checks the learner's own "has no critic".
    assert "learner.algorithm" in out and "ppo" in out, out
    assert "DEADLINE_EXCEEDED" not in out and "resume with: deploy/launch.sh" not in out, out
