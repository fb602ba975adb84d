"""DAPO dynamic sampling: equal-reward groups are consumed untrained, replaced, audited,
never lost; the valve keeps a task with no signal from stalling the run."""

import json
from collections import Counter

import pytest

from hybridflow.coordinator.buffer import Admission, GroupBuffer
from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.dataflow import ScoredGroup
from hybridflow.coordinator.dynamic_sampling import GroupFilter, is_uninformative
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.services import Services
from hybridflow.coordinator.staleness import StalenessBound
from hybridflow.types import Completion, ScoreItem, ScoreResult

from .fakes import FakeLearner, FakeRollout, records


def scored(index, scores):
    rec = records(index + 1)[index]
    completions = [Completion([1], [-1.0], "stop", 0) for _ in scores]
    return ScoredGroup(rec, completions, [ScoreResult(s) for s in scores])


def test_uninformative_means_every_score_equal():
    assert is_uninformative(scored(0, [1.0, 1.0, 1.0]))
    assert is_uninformative(scored(0, [0.0, 0.0]))
    assert not is_uninformative(scored(0, [1.0, 0.0, 1.0]))
    assert not is_uninformative(scored(0, [0.5]))  # one completion: nothing to compare


def test_filter_counts_and_opens_the_valve_after_max_rounds_batches():
    f = GroupFilter(batch_groups=2, max_rounds=2)
    equal, mixed = scored(0, [1.0, 1.0]), scored(1, [1.0, 0.0])
    assert [f.keep(equal) for _ in range(4)] == [False] * 4
    assert f.keep(mixed)
    assert f.keep(equal) and f.num_passed_equal == 1  # 4 = 2 batches' worth filtered
    f.batch_taken()
    assert not f.keep(equal)
    assert (f.num_filtered, f.num_passed_equal) == (5, 1)


def test_buffer_frees_the_slot_and_keeps_filtered_pending_until_audited():
    buf = GroupBuffer(Admission(2, StalenessBound(0)), group_filter=GroupFilter(2, 10))
    buf.admission.start(2)
    assert buf.admission.capacity() == 0
    buf.put([scored(0, [1.0, 1.0]), scored(1, [1.0, 0.0])])
    assert len(buf) == 1
    assert buf.admission.capacity() == 1  # the filtered group's slot: a new prompt
    with buf.lock:
        assert sorted(p.index for p in buf.pending()) == [0, 1]
    assert [g.prompt.index for g in buf.take_filtered()] == [0]
    with buf.lock:
        assert [p.index for p in buf.pending()] == [1]
    assert buf.take_filtered() == []


def test_a_group_with_nothing_to_train_is_audited_as_filtered_not_a_crash():
    """Every agent episode of a prompt failed before its first request: no completion."""
    buf = GroupBuffer(Admission(2, StalenessBound(0)))  # no dynamic sampling
    buf.admission.start(2)
    buf.put([scored(0, []), scored(1, [1.0, 0.0])])
    assert len(buf) == 1 and buf.admission.capacity() == 1
    assert [g.prompt.index for g in buf.take_filtered()] == [0]


class ParityReward:
    """Prompt ids divisible by 3: every completion scores 1 (no signal); else 1 for k = 0."""

    def score_batch(self, items: list[ScoreItem]):
        out = []
        for it in items:
            prompt_id, k = int(it.response[:-1]), int(it.response[-1])
            out.append(ScoreResult(1.0 if prompt_id % 3 == 0 or k == 0 else 0.0))
        return out


class NoSignalReward:
    def score_batch(self, items):
        return [ScoreResult(0.0) for _ in items]


def run_job(tmp_path, reward, **kw):
    rollouts = [FakeRollout()]
    learner = FakeLearner(rollouts)
    svc = Services(rollouts, reward, learner, ["r0"], decode=lambda ids: "".join(map(str, ids)))
    base = dict(
        num_steps=4,
        prompts_per_step=4,
        group_size=2,
        progress=False,
        save_checkpoint=False,
        prompts_per_request=1,
        dynamic_sampling=True,
    )
    base.update(kw)
    job = TrainingJob(CoordinatorConfig(**base), svc, records(30), tmp_path)
    return job, job.run(), learner


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_equal_groups_are_replaced_audited_and_never_lost(tmp_path, max_staleness):
    job, summary, learner = run_job(tmp_path, ParityReward(), max_staleness=max_staleness)
    # Every trained group carries signal: prompt ids (= index + 1) divisible by 3 never train.
    trained_ids = [s.prompt_ids[0] for batch in learner.batches for s in batch]
    assert len(learner.batches) == 4 and all(len(b) == 8 for b in learner.batches)
    assert all(pid % 3 for pid in trained_ids)
    audit = read_jsonl(tmp_path / "trained.jsonl")
    filtered = [line for line in audit if line.get("filtered")]
    assert filtered and all((line["index"] + 1) % 3 == 0 for line in filtered)
    # Filtered after the last step (async: generation runs ahead): not audited yet, still
    # pending (a checkpoint would list it), counted.
    unaudited = job.buffer.take_filtered()
    assert summary.num_filtered == len(filtered) + len(unaudited)
    # Nothing lost: each hand-out is audited once, or reported untrained, or unaudited.
    handed = Counter((line["epoch"], line["index"]) for line in audit)
    assert max(handed.values()) == 1
    total = job.cursor.state.epoch * 30 + job.cursor.state.position
    assert len(audit) + summary.num_untrained_at_end + len(unaudited) == total
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert sum(m["dynamic_sampling/filtered"] for m in metrics) == len(filtered)
    # The policy's reward counts filtered (all-1) groups too; the trained batch's does not.
    last = metrics[-1]
    assert last["dynamic_sampling/score_all_mean"] >= last["critic/score/mean"]


def test_a_task_with_no_signal_trains_anyway_after_the_valve(tmp_path):
    _, summary, learner = run_job(
        tmp_path, NoSignalReward(), num_steps=3, dynamic_sampling_max_rounds=1
    )
    assert summary.num_steps == 3 and len(learner.batches) == 3
    assert summary.num_filtered == 3 * 4  # one batch's worth before each step
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert metrics[-1]["dynamic_sampling/passed_equal"] == 3 * 4


def test_config_refuses_dynamic_sampling_with_groups_of_one():
    with pytest.raises(ValueError, match="coordinator.dynamic_sampling: needs coordinator"):
        CoordinatorConfig(dynamic_sampling=True, group_size=1).validate()
    with pytest.raises(ValueError, match="dynamic_sampling_max_rounds"):
        CoordinatorConfig(dynamic_sampling_max_rounds=0).validate()
