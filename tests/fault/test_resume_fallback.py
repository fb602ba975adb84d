"""Issue 27 rows 1, 2, 11: ``--resume`` falls back to the newest checkpoint that verifies and
fits, says so, and sets the refused ones aside; with none left it fails naming each. Runs
the coordinator's job against fake services (the learner's half is a real file with a
manifest, verified on load like the real learner's)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pytest

from hybridflow.coordinator.checkpoint import CheckpointStore
from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.services import Services
from hybridflow.errors import CheckpointRejected
from tests.unit.coordinator.fakes import FakeLearner, FakeReward, FakeRollout, records


def _services(root: Path, learner_cls: type[FakeLearner] = FakeLearner) -> Services:
    rollouts = [FakeRollout() for _ in range(2)]
    return Services(
        rollouts,
        FakeReward(),
        learner_cls(rollouts, root),
        ["r0", "r1"],
        decode=lambda ids: "".join(map(str, ids)),
    )


def _config(num_steps: int) -> CoordinatorConfig:
    return CoordinatorConfig(
        num_steps=num_steps, prompts_per_step=4, group_size=2, checkpoint_every=2, progress=False
    )


def _run(tmp_path: Path, num_steps: int, resume: bool, learner_cls=FakeLearner):
    root = tmp_path / "checkpoints"
    job = TrainingJob(
        _config(num_steps),
        _services(root, learner_cls),
        records(12),
        tmp_path,
        resume=resume,
        checkpoint_root=root,
    )
    return job.run()


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))


STEP6 = "step_00000006"
DAMAGE = {
    "learner file altered": lambda d: _flip(d / "learner" / "version"),
    "coordinator.json truncated": lambda d: (d / "coordinator.json").write_text('{"step": 6'),
    "manifest deleted": lambda d: (d / "MANIFEST.json").unlink(),
    "learner manifest deleted": lambda d: (d / "learner" / "MANIFEST.json").unlink(),
}
NAMED = {
    "learner file altered": "learner/version",
    "coordinator.json truncated": "coordinator.json",
    "manifest deleted": "MANIFEST.json",
    "learner manifest deleted": "learner/MANIFEST.json",
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_resume_falls_back_past_a_damaged_checkpoint(tmp_path, caplog, kind):
    _run(tmp_path, 6, resume=False)
    root = tmp_path / "checkpoints"
    assert CheckpointStore(root).complete_steps() == [4, 6]
    DAMAGE[kind](root / STEP6)

    with caplog.at_level(logging.WARNING, logger="hybridflow.coordinator.job_checkpoints"):
        summary = _run(tmp_path, 8, resume=True)

    assert summary.resumed_from_step == 4
    refusal = next(
        r.getMessage() for r in caplog.records if "refusing checkpoint" in r.getMessage()
    )
    assert f"{STEP6}/{NAMED[kind]}" in refusal and "\n" not in refusal
    assert any("fell back to checkpoint step 4" in r.getMessage() for r in caplog.records)
    assert (root / f"{STEP6}.refused").is_dir()  # kept to look at, no longer a checkpoint
    assert CheckpointStore(root).complete_steps() == [6, 8]  # step 6 trained and saved again
    trained = [json.loads(x) for x in (tmp_path / "trained.jsonl").read_text().splitlines()]
    assert Counter(r["step"] for r in trained) == Counter({s: 4 for s in range(1, 9)})


class MisfitLearner(FakeLearner):
    """Refuses step 6's train state as the real learner refuses another model shape."""

    def load_train_state(self, name: str) -> int:
        if name.startswith(STEP6):
            raise CheckpointRejected(
                f"{name}: does not fit this learner: actor.model.w: shape (64, 32) in the "
                "checkpoint, (96, 32) in this model"
            )
        return super().load_train_state(name)


def test_resume_falls_back_past_a_checkpoint_the_learner_refuses(tmp_path, caplog):
    _run(tmp_path, 6, resume=False)
    with caplog.at_level(logging.WARNING, logger="hybridflow.coordinator.job_checkpoints"):
        summary = _run(tmp_path, 6, resume=True, learner_cls=MisfitLearner)
    assert summary.resumed_from_step == 4
    assert any("(96, 32) in this model" in r.getMessage() for r in caplog.records)


def test_resume_with_every_checkpoint_refused_fails_naming_each(tmp_path):
    _run(tmp_path, 6, resume=False)
    root = tmp_path / "checkpoints"
    for step in (4, 6):
        _flip(root / f"step_{step:08d}" / "learner" / "version")
    with pytest.raises(CheckpointRejected) as err:
        _run(tmp_path, 8, resume=True)
    message = str(err.value)
    assert "step 6: " in message and "step 4: " in message and "learner/version" in message
    assert CheckpointStore(root).candidates() == [6, 4]  # nothing set aside, nothing loaded


def test_verify_command_prints_a_line_per_checkpoint_and_fails_on_a_bad_newest(tmp_path, capsys):
    from hybridflow.main.coordinator import main

    _run(tmp_path, 6, resume=False)
    root = tmp_path / "checkpoints"
    assert main(["verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "step_00000006  ok  (step 6, policy v6)",
        "step_00000004  ok  (step 4, policy v4)",
    ]
    _flip(root / "step_00000004" / "learner" / "version")
    assert main(["verify", str(tmp_path)]) == 0  # an older bad one is reported, not fatal
    assert "step_00000004  REFUSED  " in capsys.readouterr().out
    _flip(root / STEP6 / "learner" / "version")
    assert main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("step_00000006  REFUSED  ") and "learner/version" in out[0]
    assert main(["verify", str(tmp_path / "nothing")]) == 2
