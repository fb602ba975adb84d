"""The staleness bound: one object in versions and steps, fixed at the start from the
learner's versions per step, and checked against every step the learner reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.services import Services
from hybridflow.coordinator.staleness import StalenessBound
from hybridflow.types import LearnerNeeds, TrainStepResult

from .fakes import FakeLearner, FakeReward, FakeRollout, records


def test_versions_and_steps_are_named_apart() -> None:
    bound = StalenessBound(max_versions=5, versions_per_step=2)
    assert bound.max_steps == 2  # 2 steps ahead: at most 4 versions behind, within 5
    assert not bound.too_stale(sample_version=3, learner_version=8)
    assert bound.too_stale(sample_version=2, learner_version=8)
    assert StalenessBound(0).max_steps == 0
    with pytest.raises(ValueError, match="versions_per_step >= 1"):
        StalenessBound(2, versions_per_step=0)
    with pytest.raises(ValueError, match="max_versions >= 0"):
        StalenessBound(-1)


def test_sync_every_is_checked_in_versions() -> None:
    StalenessBound(1).check_sync_every(2)  # one step of lag is one version
    with pytest.raises(ValueError, match=r"lets samples lag 2 versions \(2 per step\)"):
        StalenessBound(1, versions_per_step=2).check_sync_every(2)


class TwoVersionLearner(FakeLearner):
    """Two optimizer steps per train step (ppo_epochs 2), as its info says."""

    def __init__(self, rollouts: list[FakeRollout], says: int) -> None:
        super().__init__(rollouts)
        self.says = says

    def schedule_needs(self) -> LearnerNeeds:
        return LearnerNeeds(versions_per_step=self.says)

    def train_step(self, samples):  # type: ignore[no-untyped-def]
        self.batches.append(samples)
        self.version += 2
        return TrainStepResult(self.version, {"actor/pg_loss": 0.1})


def _job(tmp_path: Path, learner: FakeLearner, rollout: FakeRollout, **kw: int) -> TrainingJob:
    cfg = CoordinatorConfig(
        num_steps=4,
        prompts_per_step=2,
        group_size=2,
        progress=False,
        save_checkpoint=False,
        **kw,  # type: ignore[arg-type]
    )
    svc = Services([rollout], FakeReward(), learner, ["r0"], lambda ids: "".join(map(str, ids)))
    return TrainingJob(cfg, svc, records(8), tmp_path, needs=learner.schedule_needs())


def test_the_bound_in_steps_comes_from_the_learner_at_start(tmp_path: Path) -> None:
    rollout = FakeRollout()
    learner = TwoVersionLearner([rollout], says=2)
    job = _job(tmp_path, learner, rollout, max_staleness=4)
    assert (job.buffer.bound.max_steps, job.pacer.max_lead) == (2, 2)
    summary = job.run()
    assert summary.num_steps == 4 and summary.policy_version == 8
    assert max(int(k) for k in summary.staleness_histogram) <= 4  # versions, as configured
    assert job.state.versions_per_step == 2


def test_a_learner_that_adds_other_versions_than_it_said_is_stopped(tmp_path: Path) -> None:
    rollout = FakeRollout()
    job = _job(tmp_path, TwoVersionLearner([rollout], says=1), rollout, max_staleness=1)
    with pytest.raises(RuntimeError, match="added 2 policy versions, its info said 1"):
        job.run()
