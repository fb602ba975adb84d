"""Checkpoint and resume of the schedule with fake services: a run that dies mid-way and is
resumed trains every prompt of an epoch exactly once across the crash (the audit log shows
it), continues the step numbering and the learner's version, and rewinds its logs."""

import json
from collections import Counter

import pytest

from hybridflow.coordinator.checkpoint import CheckpointStore
from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.services import Services

from .fakes import FakeLearner, FakeReward, FakeRollout, Unavailable, records


def _services(root, num_replicas=2):
    rollouts = [FakeRollout() for _ in range(num_replicas)]
    learner = FakeLearner(rollouts, root)
    svc = Services(
        rollouts,
        FakeReward(),
        learner,
        [f"r{i}" for i in range(num_replicas)],
        decode=lambda ids: "".join(map(str, ids)),
    )
    return svc, learner


def _config(**kw):
    base = dict(num_steps=9, prompts_per_step=4, group_size=2, checkpoint_every=2, progress=False)
    base.update(kw)
    return CoordinatorConfig(**base)


def _audit(run_dir):
    return [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_crash_then_resume_trains_each_prompt_once_per_epoch(tmp_path, max_staleness):
    root = tmp_path / "checkpoints"
    data = records(12)  # 9 steps x 4 prompts = 3 epochs
    cfg = _config(max_staleness=max_staleness)

    svc, learner = _services(root)
    learner.fail_at_step = 6  # the learner dies during step 6
    with pytest.raises(Unavailable):
        TrainingJob(cfg, svc, data, tmp_path, checkpoint_root=root).run()
    assert CheckpointStore(root).complete_steps() == [2, 4]
    assert max(r["step"] for r in _audit(tmp_path)) == 5  # step 5 trained, then lost

    svc, learner = _services(root)
    summary = TrainingJob(cfg, svc, data, tmp_path, resume=True, checkpoint_root=root).run()

    audit = _audit(tmp_path)
    assert [r["step"] for r in audit] == [s for s in range(1, 10) for _ in range(4)]
    seen = Counter((r["epoch"], r["index"]) for r in audit)
    assert max(seen.values()) == 1, "a prompt trained twice in one epoch"
    if max_staleness == 0:  # synchronous: hand-out order is training order, no gaps
        assert sorted(r["seq"] for r in audit) == list(range(36))
        assert seen == Counter({(e, i): 1 for e in range(3) for i in range(12)})
    assert learner.version == 9 and summary.policy_version == 9
    assert summary.resumed_from_step == 4 and summary.num_steps == 9
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 10))  # step 5's first attempt was rewound
    # The resumed learner started from the checkpoint's version, not from 0.
    assert [b[0].policy_version for b in learner.batches][0] >= 4 - max_staleness
    assert CheckpointStore(root).complete_steps() == [8, 9]  # keep_checkpoints = 2


def test_resume_without_checkpoint_starts_over_and_rewinds_logs(tmp_path):
    root = tmp_path / "checkpoints"
    cfg = _config(num_steps=3, checkpoint_every=0)
    svc, learner = _services(root)
    learner.fail_at_step = 2
    with pytest.raises(Unavailable):
        TrainingJob(cfg, svc, records(12), tmp_path, checkpoint_root=root).run()
    svc, learner = _services(root)
    summary = TrainingJob(cfg, svc, records(12), tmp_path, resume=True, checkpoint_root=root).run()
    assert summary.resumed_from_step == 0 and learner.version == 3
    assert [r["step"] for r in _audit(tmp_path)] == [s for s in (1, 2, 3) for _ in range(4)]


def test_partial_checkpoint_is_ignored_then_replaced(tmp_path):
    root = tmp_path / "checkpoints"
    cfg = _config(num_steps=4)
    svc, _ = _services(root)
    TrainingJob(cfg, svc, records(12), tmp_path, checkpoint_root=root).run()
    # The learner's half of step 6 was written, then the coordinator died before its half.
    svc.learner.save_train_state("step_00000006/learner")
    store = CheckpointStore(root)
    assert store.complete_steps() == [2, 4] and store.latest().step == 4
    svc, learner = _services(root)
    summary = TrainingJob(
        _config(num_steps=6), svc, records(12), tmp_path, resume=True, checkpoint_root=root
    ).run()
    assert summary.resumed_from_step == 4 and learner.version == 6
    assert store.complete_steps() == [4, 6]


def test_resume_refuses_another_dataset(tmp_path):
    root = tmp_path / "checkpoints"
    svc, _ = _services(root)
    TrainingJob(_config(num_steps=2), svc, records(12), tmp_path, checkpoint_root=root).run()
    svc, _ = _services(root)
    job = TrainingJob(
        _config(num_steps=4), svc, records(10), tmp_path, resume=True, checkpoint_root=root
    )
    with pytest.raises(ValueError, match="12 prompts"):
        job.run()
