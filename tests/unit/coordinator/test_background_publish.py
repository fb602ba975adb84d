"""The weight publish runs beside the next train step (``WeightPublisher.sync``) with a
learner that publishes in the background, and the version bookkeeping stays exact: a replica
is noted at version v only once the publish of v finished, one publish is in flight at a
time, in step order, a failed one is done again synchronously, and a synchronous run
(``max_staleness 0``) still generates each batch under the weights of the step before.

Ordering is controlled with events, never timed: the fake learner's ``finish_publish`` of
version v blocks until the test lets it go."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from hybridflow.clients import PublishesInBackground
from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.services import Services
from hybridflow.types import TrainSample, TrainStepResult, WeightUpdateReport

from .fakes import FakeLearner, FakeReward, FakeRollout, Unavailable, records

WAIT_S = 30.0
"""Bound on every wait in these tests: a wrong schedule fails them instead of hanging."""


class BackgroundLearner(FakeLearner):
    """A ``FakeLearner`` whose publish runs in the background: ``start_publish`` snapshots
    the version, ``finish_publish`` waits for the test's gate of that version and only then
    sets the replicas to it (what the real learner reports once every target has it)."""

    def __init__(self, rollouts: list[FakeRollout], hold: bool) -> None:
        super().__init__(rollouts)
        self.hold = hold
        """True: finish_publish of v waits for ``gates[v]``, which the next train step sets."""
        self.gates: dict[int, threading.Event] = {}
        self.log: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.pending: int | None = None
        """The version started and not yet finished."""
        self.overlapped: list[int] = []
        """Versions whose publish was still unfinished when the next train step ran."""
        self.noted_during: list[list[int]] = []
        """Each train step's view of the dispatchers' published versions."""
        self.job: TrainingJob | None = None
        self.fail_finish_of: int | None = None
        self.last_version = -1

    def train_step(self, samples: list[TrainSample]) -> TrainStepResult:
        with self.lock:
            pending = self.pending
            self.log.append(("train", self.version + 1))
        if pending is not None:
            self.overlapped.append(pending)
        if self.job is not None:
            self.noted_during.append([d.published_version for d in self.job.dispatchers])
        result = super().train_step(samples)
        if pending is not None and self.hold:
            self.gates[pending].set()  # the publish of the previous version may end now
        return result

    def start_publish(self, targets: Sequence[str]) -> int:
        with self.lock:
            assert self.pending is None, "a publish started while another was in flight"
            self.pending = self.version
            self.gates[self.version] = threading.Event()
            if self.version == self.last_version:
                self.gates[self.version].set()  # no train step follows the last publish
            self.log.append(("start", self.version))
        return self.version

    def finish_publish(self) -> WeightUpdateReport:
        with self.lock:
            version = self.pending
        assert version is not None
        if self.hold and not self.gates[version].wait(WAIT_S):
            raise AssertionError(f"no train step ran beside the publish of v{version}")
        with self.lock:
            self.pending = None
            self.log.append(("finish", version))
        if self.fail_finish_of == version:
            raise Unavailable()
        for r in self.rollouts:
            r.version = version
        return WeightUpdateReport(version, 8, 0.0)


def make_job(
    tmp_path, hold: bool, learner_class: type[BackgroundLearner] | None = None, **kw
) -> tuple[TrainingJob, BackgroundLearner]:
    rollouts = [FakeRollout()]
    learner = (learner_class or BackgroundLearner)(rollouts, hold)
    services = Services(
        rollouts, FakeReward(), learner, ["r0"], decode=lambda ids: "".join(map(str, ids))
    )
    cfg = CoordinatorConfig(
        **{
            "num_steps": 5,
            "prompts_per_step": 4,
            "group_size": 2,
            "progress": False,
            "save_checkpoint": False,
            **kw,
        }
    )
    job = TrainingJob(cfg, services, records(64), tmp_path)
    learner.job, learner.last_version = job, cfg.num_steps
    return job, learner


def test_the_fake_publishes_in_the_background() -> None:
    assert isinstance(BackgroundLearner([], hold=False), PublishesInBackground)
    assert not isinstance(FakeLearner([]), PublishesInBackground)


def test_in_an_async_run_each_publish_runs_beside_the_next_train_step(tmp_path) -> None:
    job, learner = make_job(tmp_path, hold=True, max_staleness=2)
    summary = job.run()
    assert summary.num_steps == 5 and summary.policy_version == 5
    # Steps 2..5 each trained while the publish of the step before was on its way.
    assert learner.overlapped == [1, 2, 3, 4]
    # Exactness: while v(k) was on its way, the replica was still noted at v(k-1).
    assert learner.noted_during == [[0], [0], [1], [2], [3]]
    # One publish at a time, in order, each finished; the last before the run ended.
    starts = [v for kind, v in learner.log if kind == "start"]
    finishes = [v for kind, v in learner.log if kind == "finish"]
    assert starts == finishes == [1, 2, 3, 4, 5]
    assert job.dispatchers[0].published_version == 5
    # The staleness bound holds: no sample trained more than 2 versions behind.
    for step, batch in enumerate(learner.batches, start=1):
        assert all(step - 1 - s.policy_version <= 2 for s in batch)


def test_a_sync_run_publishes_before_the_next_generation(tmp_path) -> None:
    job, learner = make_job(tmp_path, hold=False, max_staleness=0)
    job.run()
    for step, batch in enumerate(learner.batches, start=1):
        assert {s.policy_version for s in batch} == {step - 1}  # on-policy
    # Nothing to overlap: the plain publish, which ends before the step does.
    assert [kind for kind, _ in learner.log] == ["train"] * 5


def test_overlap_publish_false_keeps_every_publish_on_the_step(tmp_path) -> None:
    job, learner = make_job(tmp_path, hold=False, max_staleness=2, overlap_publish=False)
    summary = job.run()
    assert summary.num_steps == 5 and job.dispatchers[0].published_version == 5
    assert [kind for kind, _ in learner.log] == ["train"] * 5 and learner.overlapped == []


def test_a_failed_background_publish_is_done_again_and_nothing_is_lost(tmp_path) -> None:
    job, learner = make_job(tmp_path, hold=False, max_staleness=2)
    learner.fail_finish_of = 2
    synchronous: list[int] = []
    original = learner.publish_weights

    def publish(targets: Sequence[str]) -> WeightUpdateReport:
        report = original(targets)
        synchronous.append(report.policy_version)
        return report

    learner.publish_weights = publish  # type: ignore[method-assign]
    summary = job.run()
    assert summary.num_steps == 5
    # The replica is live (it answers its probe): the publish is retried synchronously with
    # the learner's then current version, which the replica is noted at.
    assert len(synchronous) == 1 and synchronous[0] >= 2
    assert not job.dispatchers[0].failed
    assert job.dispatchers[0].published_version == 5
    trained = [s.prompt_ids[0] for b in learner.batches for s in b]
    assert len(trained) == 5 * 4 * 2 and len(set(trained)) == 5 * 4


def test_a_publish_that_cannot_be_done_again_stops_the_run(tmp_path) -> None:
    job, learner = make_job(tmp_path, hold=False, max_staleness=2, service_wait_s=0.0)
    learner.fail_finish_of = 1

    def refuse(targets: Sequence[str]) -> WeightUpdateReport:
        raise Unavailable()

    learner.publish_weights = refuse  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="weight publish failed"):
        job.run()


def test_a_job_failing_mid_publish_stops_retrying_it_when_it_closes(tmp_path) -> None:
    """The learner fails: the background publish of v2 fails and its synchronous retry keeps
    failing while every replica answers (it would retry for service_wait_s), then step 3's
    train step fails. Closing the job ends the retries instead of waiting them out: with a
    minute between tries, the try under way when it closes is the last (it fails, sees the
    job closing and gives up), however slow the machine."""
    job, learner = make_job(tmp_path, hold=False, max_staleness=2, num_steps=20)
    job.publisher.retry_s = 60.0
    learner.fail_finish_of = 2
    learner.fail_at_step = 3
    attempts: list[int] = []
    retrying = threading.Event()

    def refuse(targets: Sequence[str]) -> WeightUpdateReport:
        attempts.append(1)
        retrying.set()
        raise Unavailable()

    original = learner.train_step

    def train_step(samples: list[TrainSample]) -> TrainStepResult:
        if len(learner.batches) + 1 >= 3:
            assert retrying.wait(WAIT_S)  # step 3 fails while the publish is being retried
        return original(samples)

    learner.publish_weights = refuse  # type: ignore[method-assign]
    learner.train_step = train_step  # type: ignore[method-assign]
    with pytest.raises(Unavailable):
        job.run()
    assert 1 <= len(attempts) <= 2  # not one a minute for coordinator.service_wait_s (120 s)
