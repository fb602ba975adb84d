"""Held-out evaluation (``coordinator.eval``) with fake services: every evaluated sample comes
whole from one policy version even while weights change under it; evaluations run at their
steps and hold the next weight publish; a resumed run logs none twice and redoes one a crash
cut; one that hangs is given up at its deadline while training goes on."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.eval_config import EvalConfig, EvalSet
from hybridflow.coordinator.evaluation import EvalSet as LoadedSet
from hybridflow.coordinator.evaluation import Evaluator, eval_params
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.services import Services
from hybridflow.types import Completion

from .fakes import FakeLearner, FakeReward, FakeRollout, records


def services(rollouts, learner=None) -> Services:
    return Services(
        rollouts,
        FakeReward(),
        learner or FakeLearner(rollouts),
        [f"r{i}" for i in range(len(rollouts))],
        decode=lambda ids: "".join(map(str, ids)),
    )


class MovingWeights(FakeRollout):
    """A replica whose weights change under an evaluation: its first evaluation request comes
    back with one completion updated mid-sequence (tokens of versions 3 and 4)."""

    def __init__(self, version: int, first_answer: threading.Event) -> None:
        super().__init__()
        self.version = version
        self.first_answer = first_answer
        self.calls = 0

    def generate(self, prompts, params, request_id=""):
        self.calls += 1
        groups = super().generate(prompts, params, request_id)
        if self.calls == 1:
            c = groups[0][0]
            groups[0][0] = Completion(c.token_ids, c.logprobs, "stop", 3, token_versions=[3, 4])
        self.first_answer.set()
        return groups


class Rejoined(FakeRollout):
    """A replica that rejoined with newer weights (version 4); it answers only once the other
    has, so the evaluation is pinned to the other's version."""

    def __init__(self, after: threading.Event) -> None:
        super().__init__()
        self.version = 4
        self.after = after

    def generate(self, prompts, params, request_id=""):
        self.after.wait(30)
        return super().generate(prompts, params, request_id)


def evaluator(rollouts, tmp_path: Path, **eval_kw) -> Evaluator:
    cfg = EvalConfig(sets=[EvalSet("held", "x")], k=2, prompts_per_request=2, **eval_kw)
    sets = [LoadedSet("held", records(8))]
    return Evaluator(
        cfg, sets, services(rollouts), eval_params(cfg, 4, 0), tmp_path, threading.Event()
    )


def test_every_sample_of_an_evaluation_comes_whole_from_one_version(tmp_path):
    answered = threading.Event()
    moving, rejoined = MovingWeights(3, answered), Rejoined(answered)
    ev = evaluator([moving, rejoined], tmp_path)
    ev.load_records()
    assert ev.start(5)
    ev.wait()
    (result,) = ev.take_results()
    groups = ev.last_groups["held"]
    assert result.complete and len(groups) == 8
    versions = {c.policy_version for g in groups for c in g.completions}
    spanning = [c for g in groups for c in g.completions if c.token_versions is not None]
    assert versions == {3} and not spanning
    assert result.policy_version == 3 and result.metrics["eval/held/policy_version"] == 3.0
    # the completion updated mid-sequence and every prompt the rejoined replica answered
    assert result.metrics["eval/held/redone"] >= 1 + 2 * bool(rejoined.requests)
    assert not ev.hold.taken


def config(**kw) -> CoordinatorConfig:
    base = dict(
        num_steps=4, prompts_per_step=2, group_size=2, progress=False, save_checkpoint=False
    )
    base.update(kw)
    return CoordinatorConfig(**base)


def eval_config(**kw) -> EvalConfig:
    return EvalConfig(sets=[EvalSet("held", "x")], every=2, k=2, **kw)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_job(tmp_path, cfg, learner_root=None, resume=False, rollouts=None):
    rollouts = rollouts or [FakeRollout()]
    learner = FakeLearner(rollouts, root=learner_root)
    job = TrainingJob(
        cfg,
        services(rollouts, learner),
        records(16),
        tmp_path,
        resume=resume,
        checkpoint_root=learner_root,
        eval_sets=[LoadedSet("held", records(4))],
    )
    for rollout in rollouts:
        rollout.job, rollout.learner = job, learner
    job.run()
    return job, learner


class AnswersOnceThePublishIsDue(FakeRollout):
    """An evaluation request (but the last step's) answers only once the job's next publish
    has come: waiting on the evaluation's hold, or, were there no hold, done (then under the
    new weights). Its answer then carries the version the replica holds at that moment."""

    def generate(self, prompts, params, request_id=""):
        if request_id.startswith("eval") and self.version < self.job.config.num_steps:
            hold, published = self.job.evaluations.evaluator.hold, len(self.learner.published)
            waits = hold.num_waits
            for _ in range(3000):  # the publish comes after the next train step
                if hold.num_waits > waits or len(self.learner.published) > published:
                    break
                threading.Event().wait(0.01)
        return super().generate(prompts, params, request_id)


def test_evaluations_run_at_their_steps_pinned_to_the_published_version(tmp_path):
    """Each evaluation's requests answer only once the next step's publish is due: the hold
    makes that publish wait, so the evaluation is of the step it was started for."""
    run_job(tmp_path, config(eval=eval_config()), rollouts=[AnswersOnceThePublishIsDue()])
    evals = [r for r in lines(tmp_path / "metrics.jsonl") if "eval/held/pass@1" in r]
    assert [r["step"] for r in evals] == [0, 2, 4]
    # The version a step's publish sent (one per step): the hold kept it for the evaluation.
    assert [r["eval/held/policy_version"] for r in evals] == [0, 2, 4]
    assert [r["eval/held/num_prompts"] for r in evals] == [4, 4, 4]
    records_ = lines(tmp_path / "eval.jsonl")
    assert [(r["step"], r["name"]) for r in records_] == [(0, "held"), (2, "held"), (4, "held")]


def test_a_resumed_run_logs_no_evaluation_twice_and_redoes_one_a_crash_cut(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    cfg = config(num_steps=2, checkpoint_every=2, eval=eval_config())
    run_job(tmp_path, cfg, root)
    assert [r["step"] for r in lines(tmp_path / "eval.jsonl")] == [0, 2]
    run_job(tmp_path, config(num_steps=4, checkpoint_every=2, eval=eval_config()), root, True)
    assert [r["step"] for r in lines(tmp_path / "eval.jsonl")] == [0, 2, 4]
    logged = [r["step"] for r in lines(tmp_path / "metrics.jsonl") if "eval/held/pass@1" in r]
    assert logged == [0, 2, 4]

    # A crash cut the evaluation of step 4 (its line never written): the resume from the
    # checkpoint of step 4 runs it again, whole, before it goes on.
    kept = [
        line
        for line in (tmp_path / "eval.jsonl").read_text().splitlines()
        if '"step": 4' not in line
    ]
    (tmp_path / "eval.jsonl").write_text("".join(f"{line}\n" for line in kept))
    run_job(tmp_path, config(num_steps=6, checkpoint_every=2, eval=eval_config()), root, True)
    steps = [r["step"] for r in lines(tmp_path / "eval.jsonl")]
    assert steps == [0, 2, 4, 6]


class Hangs(FakeRollout):
    """Answers training; an evaluation request never comes back (until the test ends)."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def generate(self, prompts, params, request_id=""):
        if request_id.startswith("eval"):
            self.release.wait()
        return super().generate(prompts, params, request_id)


def test_an_evaluation_that_hangs_is_given_up_at_its_deadline_and_training_goes_on(tmp_path):
    release = threading.Event()
    try:
        cfg = config(eval=eval_config(timeout_s=0.2, before_training=False))
        job, learner = run_job(tmp_path, cfg, rollouts=[Hangs(release)])
    finally:
        release.set()
    assert len(learner.batches) == 4  # every step trained
    evals = [r for r in lines(tmp_path / "metrics.jsonl") if "eval/held/timed_out" in r]
    assert evals and all(r["eval/held/timed_out"] == 1.0 for r in evals)
    assert not (tmp_path / "eval.jsonl").exists()  # nothing complete is recorded
