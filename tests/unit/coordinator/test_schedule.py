"""Schedule invariants with fake services: exactly-once per epoch, re-queue on replica
failure, staleness 0 on the synchronous path, pause/stop between steps."""

import json
import threading
from collections import Counter

import pytest

from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.control import JobControl
from hybridflow.coordinator.cursor import PromptCursor
from hybridflow.coordinator.dataflow import split_round_robin
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.step import Services, run_step
from hybridflow.types import SamplingParams

from .fakes import FakeLearner, FakeReward, FakeRollout, records


def services(num_replicas=2, failing=()):
    rollouts = [FakeRollout(fail=i in failing) for i in range(num_replicas)]
    learner = FakeLearner(rollouts)
    return (
        Services(
            rollouts,
            FakeReward(),
            learner,
            [f"r{i}" for i in range(num_replicas)],
            decode=lambda ids: "".join(map(str, ids)),
        ),
        rollouts,
        learner,
    )


def config(**kw):
    base = dict(num_steps=5, prompts_per_step=4, group_size=2, progress=False)
    base.update(kw)
    return CoordinatorConfig(**base)


def test_round_robin_split():
    assert split_round_robin(5, 2) == [[0, 2, 4], [1, 3]]
    assert split_round_robin(1, 3) == [[0], [], []]


def test_cursor_hands_out_each_row_once_per_epoch():
    cursor = PromptCursor(list(range(10)), seed=3)
    first = cursor.take(4) + cursor.take(6)
    assert sorted(first) == list(range(10))
    second = cursor.take(10)
    assert sorted(second) == list(range(10)) and second != first  # reshuffled
    assert cursor.state.epoch == 1 and cursor.state.position == 10


def test_every_prompt_trained_exactly_once_per_epoch(tmp_path):
    svc, rollouts, learner = services()
    data = records(12)
    learner.root = tmp_path / "checkpoints"
    job = TrainingJob(config(num_steps=3), svc, data, tmp_path, checkpoint_root=learner.root)
    summary = job.run()
    trained = Counter(s.prompt_ids[0] for batch in learner.batches for s in batch)
    assert trained == Counter({r.prompt_ids[0]: 2 for r in data})  # group_size samples each
    assert summary.num_steps == 3 and summary.num_dropped_stale == 0
    assert learner.checkpoints == ["hf/step_00000003"]
    assert summary.last_checkpoint == str(learner.root / "step_00000003")
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]
    assert json.loads((tmp_path / "summary.json").read_text())["num_steps"] == 3


def test_group_ids_group_the_samples_of_one_prompt(tmp_path):
    svc, _, learner = services()
    TrainingJob(config(num_steps=2), svc, records(8), tmp_path).run()
    for batch in learner.batches:
        by_group = {}
        for s in batch:
            by_group.setdefault(s.group_id, set()).add(tuple(s.prompt_ids))
        assert len(by_group) == 4 and all(len(v) == 1 for v in by_group.values())


def test_failed_replica_prompts_are_requeued_not_lost():
    svc, rollouts, learner = services(num_replicas=2, failing={1})
    params = SamplingParams(n=2)
    data = records(4)
    outcome = run_step(svc, data, params, step_index=1, expected_version=0)
    assert outcome.num_requeued == 2
    assert sorted(s.prompt_ids[0] for s in learner.batches[0]) == [1, 1, 2, 2, 3, 3, 4, 4]
    assert sorted(p[0] for p in rollouts[0].prompts_seen) == [1, 2, 3, 4]


def test_all_replicas_failing_is_an_error():
    svc, _, _ = services(num_replicas=2, failing={0, 1})
    with pytest.raises(RuntimeError, match="every rollout replica failed"):
        run_step(svc, records(2), SamplingParams(n=1), step_index=1)


def test_stale_samples_are_counted():
    svc, rollouts, _ = services(num_replicas=1)
    outcome = run_step(svc, records(2), SamplingParams(n=2), 1, publish=False, expected_version=1)
    assert outcome.num_stale == 4 and outcome.metrics["async/num_stale"] == 4.0


def test_sync_path_rollouts_always_run_the_latest_policy(tmp_path):
    svc, rollouts, learner = services()
    TrainingJob(config(num_steps=4), svc, records(16), tmp_path).run()
    for step, batch in enumerate(learner.batches):
        assert {s.policy_version for s in batch} == {step}


def test_sync_every_beyond_staleness_is_rejected(tmp_path):
    svc, _, _ = services()
    with pytest.raises(ValueError, match="over max_staleness=0"):
        TrainingJob(config(sync_every=2), svc, records(4), tmp_path)


def test_stop_between_steps_saves_and_reports(tmp_path):
    svc, _, learner = services()
    control = JobControl(5)
    original = learner.train_step

    def train_then_stop(samples):
        result = original(samples)
        if len(learner.batches) == 2:
            control.stop()
        return result

    learner.train_step = train_then_stop
    learner.root = tmp_path / "checkpoints"
    summary = TrainingJob(
        config(), svc, records(40), tmp_path, control, checkpoint_root=learner.root
    ).run()
    assert summary.num_steps == 2 and len(learner.batches) == 2
    assert control.status().state == "done" and learner.checkpoints == ["hf/step_00000002"]
    # The stop wrote a resumable checkpoint of the last step (checkpoint_every is 50).
    assert summary.last_checkpoint.endswith("step_00000002")


def test_pause_blocks_until_resume(tmp_path):
    svc, _, learner = services()
    control = JobControl(3)
    control.pause()
    job = TrainingJob(config(num_steps=3), svc, records(12), tmp_path, control)
    thread = threading.Thread(target=job.run)
    thread.start()
    assert control.wait_for_state(("paused",), 10)
    assert learner.batches == []
    control.resume()
    thread.join(10)
    assert not thread.is_alive() and len(learner.batches) == 3
    assert control.status().state == "done"
