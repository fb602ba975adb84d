"""Replica failures with fake services: a replica that restarts (comes back with its initial
weights) or is unreachable for a while rejoins with the current weights, and the run ends with
every step trained; one that never comes back leaves the job with a clear error."""

import threading
import time
from types import SimpleNamespace

import pytest

from hybridflow import errors
from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.liveness import PROBE_TIMEOUT_S
from hybridflow.coordinator.publish import _alive
from hybridflow.coordinator.services import Services

from .fakes import FakeLearner, FakeReward, FakeRollout, Unavailable, records


class RestartingRollout(FakeRollout):
    """Loses its weights (version 0) on generate call ``restart_at``, as a restarted
    replica would; is unreachable for ``down_calls`` calls after ``down_at``."""

    def __init__(self, restart_at: int = 0, down_at: int = 0, down_calls: int = 0) -> None:
        super().__init__()
        self.calls = 0
        self.restart_at, self.down_at, self.down_calls = restart_at, down_at, down_calls
        self.lock = threading.Lock()

    def generate(self, prompts, params, request_id=""):
        with self.lock:
            self.calls += 1
            if self.calls == self.restart_at:
                self.version = 0
            if self.down_at and self.down_at <= self.calls < self.down_at + self.down_calls:
                raise Unavailable()
        return super().generate(prompts, params, request_id)

    def status(self, timeout_s=None):
        with self.lock:
            if self.down_at and self.down_at <= self.calls < self.down_at + self.down_calls:
                self.calls += 1  # each probe counts: the replica comes back after a few
                raise Unavailable()
        return super().status(timeout_s)


def _job(tmp_path, rollout, **kw):
    learner = FakeLearner([rollout])
    svc = Services([rollout], FakeReward(), learner, ["r0"], decode=lambda ids: str(ids[-1]))
    cfg = CoordinatorConfig(num_steps=6, prompts_per_step=4, group_size=2, progress=False, **kw)
    return TrainingJob(cfg, svc, records(12), tmp_path), learner


def test_restarted_replica_rejoins_with_current_weights(tmp_path):
    rollout = RestartingRollout(restart_at=3)
    job, learner = _job(tmp_path, rollout, replica_rejoin_timeout_s=30)
    summary = job.run()
    assert summary.num_steps == 6 and learner.version == 6
    assert job.dispatchers[0].num_rejoined == 1
    assert summary.staleness_histogram == {"0": 24}  # nothing trained under lost weights


def test_unreachable_replica_is_waited_for_then_rejoins(tmp_path):
    rollout = RestartingRollout(down_at=3, down_calls=2)
    job, learner = _job(tmp_path, rollout, replica_rejoin_timeout_s=30)
    summary = job.run()
    assert summary.num_steps == 6 and job.dispatchers[0].num_rejoined == 1
    assert summary.num_requeued == 4  # the failed request's prompts, generated again


def test_replica_that_never_comes_back_fails_the_job(tmp_path):
    rollout = RestartingRollout(down_at=2, down_calls=10**9)
    job, _ = _job(tmp_path, rollout, replica_rejoin_timeout_s=0)
    with pytest.raises(RuntimeError, match="replica_rejoin_timeout_s"):
        job.run()


class Exhausted(errors.ResourceExhausted):
    """A replica at its concurrency limit sheds the call: busy, not gone."""


class ProbedRollout(FakeRollout):
    """Records the deadline of each status probe; answers or raises ``error``."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__()
        self.error = error
        self.deadlines: list[float | None] = []

    def status(self, timeout_s=None):
        self.deadlines.append(timeout_s)
        if self.error is not None:
            raise self.error
        return super().status(timeout_s)


def test_liveness_probe_has_a_short_deadline_and_a_busy_replica_is_alive():
    busy, gone, fine = ProbedRollout(Exhausted()), ProbedRollout(Unavailable()), ProbedRollout()
    verdicts = [_alive(SimpleNamespace(rollout=r)) for r in (busy, gone, fine)]
    assert verdicts == [True, False, True]  # load shedding is not death
    assert {d for r in (busy, gone, fine) for d in r.deadlines} == {PROBE_TIMEOUT_S}


class UndeliveredRejoinLearner(FakeLearner):
    """Once ``down`` has been down, every publish to it fails verification (it came back but
    serves other weights than it was sent)."""

    def __init__(self, down: RestartingRollout) -> None:
        super().__init__([down])
        self.down = down
        self.failed_publishes = 0

    def publish_weights(self, targets, catch_up=False):  # type: ignore[no-untyped-def]
        if "r0" in targets and self.down.calls >= self.down.down_at:
            self.failed_publishes += 1
            raise errors.DeliveryFailed(f"weights v{self.version} did not take effect on {targets}")
        return super().publish_weights(targets)


def _wait(condition, what: str, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.01)  # another thread's state: nothing to wait on


class TakingOverRollout(FakeRollout):
    """The replica that serves on while the other is out, in a fixed order whatever the
    threads' timing: it starts once replica 0 has failed, serves ``num_before`` requests,
    waits until replica 0's dispatcher has stopped with its error, then serves freely (the
    buffer stays full, so only an error check that does not wait for an empty buffer stops
    the run)."""

    def __init__(self, num_before: int) -> None:
        super().__init__()
        self.num_before, self.calls = num_before, 0
        self.other: object = None
        """Replica 0's dispatcher, set once the job has built it."""

    def generate(self, prompts, params, request_id=""):
        _wait(lambda: self.other is not None and self.other.failed, "replica 0 failing")
        self.calls += 1
        if self.calls > self.num_before:
            _wait(lambda: self.other.error is not None, "replica 0's rejoin error")
        return super().generate(prompts, params, request_id)


def test_a_replica_whose_rejoin_sync_does_not_take_effect_stops_the_run(tmp_path, caplog):
    """Chosen rule (docs/fault-tolerance.md): a replica that is back but whose rejoin sync did
    not take effect stops the run naming it, as any failed delivery does, even while another
    replica serves on; its in-flight prompts were re-queued when it failed."""
    down = RestartingRollout(down_at=1, down_calls=2)  # its first request fails
    learner = UndeliveredRejoinLearner(down)
    healthy = TakingOverRollout(num_before=4)
    learner.rollouts.append(healthy)
    svc = Services(
        [down, healthy], FakeReward(), learner, ["r0", "r1"], decode=lambda ids: str(ids[-1])
    )
    cfg = CoordinatorConfig(
        num_steps=50, prompts_per_step=4, group_size=2, progress=False,
        replica_rejoin_timeout_s=30, prompts_per_request=2,
    )  # fmt: skip
    job = TrainingJob(cfg, svc, records(12), tmp_path)
    healthy.other = job.dispatchers[0]
    with pytest.raises(RuntimeError, match=r"replica 0 \(r0\) rejoined, but weights v\d+ did not"):
        job.run()
    assert learner.failed_publishes == 1  # one rejoin attempt, not retried until the timeout
    assert job.dispatchers[0].num_rejoined == 0 and job.dispatchers[0].num_requeued == 2
    assert learner.version < cfg.num_steps  # nothing trained on after the failed delivery
    assert "rejoined without its weights taking effect" in caplog.text
