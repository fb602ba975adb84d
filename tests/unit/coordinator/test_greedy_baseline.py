"""ReMax's greedy baselines in the dispatcher, with fake services: one extra greedy request
(temperature 0, n 1) per request on the same replica, scored in the same reward call, its
score on each group; nothing extra when the learner does not ask for it; a failed greedy call
fails the request (its prompts re-queued)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from hybridflow.coordinator.buffer import Admission, GroupBuffer
from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.cursor import PromptCursor
from hybridflow.coordinator.dataflow import ScoredGroup, rollout_metrics, train_samples
from hybridflow.coordinator.dispatch import ReplicaDispatcher
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.services import Services
from hybridflow.coordinator.staleness import StalenessBound
from hybridflow.types import Completion, SamplingParams, ScoreItem, ScoreResult

from .fakes import FakeLearner, FakeReward, FakeRollout, Unavailable, records

PARAMS = SamplingParams(temperature=1.0, top_p=0.9, top_k=3, max_new_tokens=7, n=2, seed=5)


@dataclass
class Call:
    prompts: list[list[int]]
    params: SamplingParams
    request_id: str


class RecordingRollout(FakeRollout):
    """Records every request. Samples [x] -> [x, k] as FakeRollout; a greedy request answers
    [x, x % 2] (scored 1 for even x, 0 for odd by FakeReward)."""

    def __init__(self, fail_greedy: bool = False) -> None:
        super().__init__()
        self.calls: list[Call] = []
        self.fail_greedy = fail_greedy

    def generate(self, prompts, params, request_id=""):
        self.calls.append(Call([list(p) for p in prompts], params, request_id))
        if params.temperature > 0:
            return super().generate(prompts, params, request_id)
        if self.fail_greedy:
            raise Unavailable()
        return [[Completion([p[0], p[0] % 2], [-0.1, -0.1], "stop", self.version)] for p in prompts]


class StoppingReward(FakeReward):
    """Records each scored batch; sets ``stop`` after ``num_calls`` calls."""

    def __init__(self, stop: threading.Event, num_calls: int) -> None:
        self.batches: list[list[ScoreItem]] = []
        self.stop, self.num_calls = stop, num_calls

    def score_batch(self, items: list[ScoreItem]) -> list[ScoreResult]:
        self.batches.append(list(items))
        if len(self.batches) == self.num_calls:
            self.stop.set()
        return super().score_batch(items)


def run_dispatcher(
    rollout: RecordingRollout, greedy_baseline: bool
) -> tuple[ReplicaDispatcher, StoppingReward, GroupBuffer]:
    """Two requests of two prompts each, run on this thread until the reward stops it."""
    stop = threading.Event()
    reward = StoppingReward(stop, num_calls=2)
    buffer = GroupBuffer(Admission(batch_groups=4, bound=StalenessBound(0)))
    dispatcher = ReplicaDispatcher(
        0,
        rollout,
        reward,
        lambda ids: "".join(map(str, ids)),
        buffer,
        PromptCursor(records(4), seed=0),
        PARAMS,
        prompts_per_request=2,
        stop=stop,
        greedy_baseline=greedy_baseline,
    )
    dispatcher.run()
    return dispatcher, reward, buffer


def expected_baseline(group: ScoredGroup) -> float:
    return 1.0 if group.prompt.prompt_ids[0] % 2 == 0 else 0.0


def test_greedy_baseline_is_generated_scored_together_and_attached() -> None:
    rollout = RecordingRollout()
    dispatcher, reward, buffer = run_dispatcher(rollout, greedy_baseline=True)
    assert dispatcher.error is None and dispatcher.num_requeued == 0
    assert len(rollout.calls) == 4  # each request: its samples, then its greedy baseline
    for sampled, greedy in zip(rollout.calls[::2], rollout.calls[1::2], strict=True):
        assert sampled.params.temperature == 1.0 and sampled.params.n == 2
        assert greedy.params == replace(sampled.params, temperature=0.0, top_p=1.0, top_k=0, n=1)
        assert greedy.params.max_new_tokens == PARAMS.max_new_tokens
        assert greedy.prompts == sampled.prompts
        assert greedy.request_id == f"{sampled.request_id}-greedy"
    # One reward call per request: 2 prompts x 2 samples, then the 2 greedy responses.
    assert [len(b) for b in reward.batches] == [6, 6]
    for batch, sampled in zip(reward.batches, rollout.calls[::2], strict=True):
        assert [it.response for it in batch[4:]] == [f"{x}{x % 2}" for (x,) in sampled.prompts]
    groups, requeued = buffer.drain()
    assert len(groups) == 4 and not requeued
    assert [g.baseline for g in groups] == [expected_baseline(g) for g in groups]
    assert all([r.score for r in g.results] == [1.0, 0.0] for g in groups)
    samples = train_samples(groups)
    assert [s.baseline for s in samples] == [expected_baseline(g) for g in groups for _ in "ab"]
    assert rollout_metrics(groups)["rollout/baseline_score/mean"] == 0.5


def test_without_greedy_baseline_nothing_changes() -> None:
    rollout = RecordingRollout()
    dispatcher, reward, buffer = run_dispatcher(rollout, greedy_baseline=False)
    assert dispatcher.error is None
    assert len(rollout.calls) == 2
    assert all(c.params.temperature == 1.0 and c.params.n == 2 for c in rollout.calls)
    assert [len(b) for b in reward.batches] == [4, 4]
    groups, _ = buffer.drain()
    assert len(groups) == 4 and all(g.baseline is None for g in groups)
    assert all(s.baseline is None for s in train_samples(groups))
    assert "rollout/baseline_score/mean" not in rollout_metrics(groups)


def test_failed_greedy_call_fails_the_request_and_requeues_its_prompts() -> None:
    rollout = RecordingRollout(fail_greedy=True)
    dispatcher, reward, buffer = run_dispatcher(rollout, greedy_baseline=True)
    assert dispatcher.failed and dispatcher.error is None  # a replica failure, not bad input
    assert dispatcher.num_requeued == 2 and not reward.batches
    groups, requeued = buffer.drain()
    assert not groups
    assert sorted(list(p.prompt_ids) for p in requeued) == sorted(rollout.calls[0].prompts)


def test_training_job_sends_baselines_when_asked(tmp_path: Path) -> None:
    rollout = RecordingRollout()
    learner = FakeLearner([rollout])
    learner.greedy_baseline = True  # what run.py asks the learner before building the job
    svc = Services([rollout], FakeReward(), learner, ["r0"], lambda ids: "".join(map(str, ids)))
    cfg = CoordinatorConfig(
        num_steps=2, prompts_per_step=2, group_size=2, progress=False, save_checkpoint=False
    )
    TrainingJob(cfg, svc, records(4), tmp_path, needs=svc.learner.schedule_needs()).run()
    trained = [s for batch in learner.batches for s in batch]
    assert len(trained) == 8
    assert all(s.baseline == (1.0 if s.prompt_ids[0] % 2 == 0 else 0.0) for s in trained)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    per_step = [sum(s.baseline for s in b) / len(b) for b in learner.batches]  # groups of 2
    assert [m["rollout/baseline_score/mean"] for m in lines] == per_step
