"""Steps sent ahead (``coordinator.train_ahead``, ``coordinator/ahead.py``) against a fake
learner that trains ahead as the learner service does (``AheadFakeLearner``): the next step
goes to the learner while the current one trains, steps train in order and once, each
publish starts in the learner, staleness is counted against the version a step starts
from, and nothing is sent ahead across a checkpoint, a stop or a failure.

Ordering is controlled, never timed: a step the test wants followed ahead trains only once
the next one was sent (``hold_for_next``); if the job never sends it, the fake fails the
step and the test fails."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from hybridflow.clients import TrainsAhead
from hybridflow.coordinator.ahead import AheadRule, SentStep
from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.control import JobControl
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.services import Services

from .fakes import AheadFakeLearner, FakeReward, FakeRollout, Unavailable, records


def make_job(
    tmp_path: Path, checkpoints: bool = False, **kw: Any
) -> tuple[TrainingJob, AheadFakeLearner]:
    rollouts = [FakeRollout()]
    learner = AheadFakeLearner(rollouts, tmp_path / "checkpoints")
    services = Services(
        rollouts, FakeReward(), learner, ["r0"], decode=lambda ids: "".join(map(str, ids))
    )
    cfg = CoordinatorConfig(
        **{
            "num_steps": 6,
            "prompts_per_step": 4,
            "group_size": 2,
            "progress": False,
            "save_checkpoint": False,
            "max_staleness": 2,
            **kw,
        }
    )
    job = TrainingJob(
        cfg,
        services,
        records(64),
        tmp_path,
        checkpoint_root=tmp_path / "checkpoints" if checkpoints else None,
    )
    return job, learner


def audit(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]


def test_the_fake_trains_ahead() -> None:
    assert isinstance(AheadFakeLearner([]), TrainsAhead)


def test_each_step_is_sent_while_the_one_before_trains(tmp_path: Path) -> None:
    job, learner = make_job(tmp_path)
    learner.hold_for_next = {0, 1, 2, 3, 4}  # step 6 (from v5) is the last: nothing after it
    summary = job.run()
    assert summary.num_steps == 6 and summary.policy_version == 6
    # (start version, steps in flight when it was sent): steps 2..6 went beside the one before.
    assert learner.sent == [(0, 0), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]
    assert learner.refused == [] and len(learner.batches) == 6
    # Each step started its own publish, in order; the replica ends at the last version.
    assert learner.in_step == learner.background == [1, 2, 3, 4, 5, 6]
    assert job.dispatchers[0].published_version == 6
    # Staleness against the version each step started from: within max_staleness.
    lags = [start - s.policy_version for start, batch in enumerate(learner.batches) for s in batch]
    assert min(lags) >= 0 and max(lags) <= 2
    # Every group trained once, at its step.
    lines = audit(tmp_path)
    assert sorted(line["step"] for line in lines) == [s for s in range(1, 7) for _ in range(4)]
    assert len({(line["epoch"], line["index"]) for line in lines}) == len(lines)
    # A step's times count from the end of the one before: the learner is never busier
    # than the wall clock.
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "timing_s/step" in m]
    assert all(m["timing_s/step"] > 0 for m in steps)
    assert all(0.0 <= m["async/learner_idle_ratio"] <= 1.0 for m in steps)


def test_no_step_is_sent_ahead_of_a_checkpoint(tmp_path: Path) -> None:
    job, learner = make_job(tmp_path, checkpoints=True, checkpoint_every=2)
    learner.hold_for_next = {0, 2, 4}  # steps 1, 3, 5; steps 2 and 4 end in a checkpoint
    saved: dict[int, int] = {}
    save = learner.save_train_state

    def save_and_note(name: str) -> int:  # names like step_00000002/learner
        saved[int(re.search(r"step_(\d+)", name).group(1))] = learner.version  # type: ignore[union-attr]
        return save(name)

    learner.save_train_state = save_and_note  # type: ignore[method-assign]
    job.run()
    assert learner.sent == [(0, 0), (1, 1), (2, 0), (3, 1), (4, 0), (5, 1)]
    # Each train state holds its own step's version (no later step had run).
    assert saved == {2: 2, 4: 4, 6: 6}


def test_a_stop_lets_the_step_sent_ahead_train_and_log(tmp_path: Path) -> None:
    job, learner = make_job(tmp_path)
    learner.hold_for_next = {1}
    stopped = threading.Event()

    def stop_when_step_3_is_sent(start_version: int) -> None:
        if start_version == 2:
            job.control.stop()
            stopped.set()

    learner.on_send = stop_when_step_3_is_sent
    summary = job.run()
    assert stopped.is_set()
    # Step 3 was on its way when the stop came: it trained and was logged, nothing after it.
    assert summary.num_steps == 3 and len(learner.batches) == 3
    assert [start for start, _ in learner.sent] == [0, 1, 2]
    assert sorted({line["step"] for line in audit(tmp_path)}) == [1, 2, 3]


def test_a_failed_step_gives_up_the_one_sent_ahead(tmp_path: Path) -> None:
    job, learner = make_job(tmp_path)
    learner.hold_for_next = {0, 1, 2}
    learner.fail_at_step = 3
    with pytest.raises(Unavailable):
        job.run()
    # Step 4 was sent beside step 3, which failed: it was cancelled and refused, not trained.
    assert [start for start, _ in learner.sent] == [0, 1, 2, 3]
    assert learner.pendings[3].cancelled
    assert learner.refused == [3] and len(learner.batches) == 2
    assert sorted({line["step"] for line in audit(tmp_path)}) == [1, 2]


def test_a_publish_the_learner_could_not_start_is_the_jobs(tmp_path: Path) -> None:
    job, learner = make_job(tmp_path)
    learner.no_publish_from = {2}  # step 3's targets did not all answer
    summary = job.run()
    assert summary.policy_version == 6
    assert learner.in_step == [1, 2, 4, 5, 6]
    assert learner.background == [1, 2, 3, 4, 5, 6]  # v3 through the job's StartPublish
    assert job.dispatchers[0].published_version == 6


def test_a_synchronous_run_never_sends_ahead(tmp_path: Path) -> None:
    job, learner = make_job(tmp_path, max_staleness=0)
    job.run()
    assert learner.sent == [] and len(learner.batches) == 6


def test_train_ahead_false_sends_one_step_at_a_time(tmp_path: Path) -> None:
    job, learner = make_job(tmp_path, train_ahead=False)
    job.run()
    assert learner.sent == [] and learner.in_step == [] and len(learner.batches) == 6


class _Hold:
    def __init__(self, taken: bool) -> None:
        self.taken = taken


class _Publisher:
    def __init__(self, hold: _Hold | None = None) -> None:
        self.hold = hold


def _rule(due: set[int] = frozenset(), hold: bool = False, **kw: Any) -> AheadRule:  # type: ignore[assignment]
    cfg = CoordinatorConfig(**{"num_steps": 8, "progress": False, **kw})
    return AheadRule(cfg, JobControl(8), _Publisher(_Hold(hold)), lambda s: s in due)  # type: ignore[arg-type]


def _sent(step: int, publishes: bool) -> SentStep:
    sent = SentStep(step, [], [], 0.0, 0.0, 0.0)
    if publishes:
        sent.serving = [object()]  # type: ignore[list-item]
    return sent


def test_the_rule_for_a_steps_own_publish() -> None:
    every_2 = _rule(sync_every=2)
    assert [s for s in range(1, 9) if every_2.publishes_in_step(s)] == [2, 4, 6, 8]
    # An evaluation due at step 3 starts with the publish of step 4: step 6 publishes
    # through the job (which waits for the evaluation's hold), not in its step.
    due_3 = _rule(sync_every=2, due={3})
    assert [s for s in range(1, 9) if due_3.publishes_in_step(s)] == [2, 4, 8]
    assert not _rule(hold=True).publishes_in_step(2)


def test_the_rule_for_sending_the_next_step() -> None:
    rule = _rule(checkpoint_every=3)
    assert rule.may_send_after(_sent(1, publishes=True))
    assert not rule.may_send_after(_sent(1, publishes=False))  # its publish is the job's
    assert not rule.may_send_after(_sent(3, publishes=True))  # a checkpoint follows it
    assert not rule.may_send_after(_sent(8, publishes=True))  # the last step
    assert not _rule(due={2}).may_send_after(_sent(2, publishes=True))
    # A step that does not publish may be followed (sync_every 2, step 1).
    assert _rule(sync_every=2).may_send_after(_sent(1, publishes=False))
    paused = _rule()
    paused.control.pause()
    assert not paused.may_send_after(_sent(1, publishes=True))
