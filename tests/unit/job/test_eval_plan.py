"""``eval_plan``: an offline evaluation runs the job's own services (a multi-turn job's
environment service included), the learner only for a train state, and waits for them all."""

from __future__ import annotations

from hybridflow.job.plan import eval_plan, plan
from hybridflow.job_config import load_job_config

MULTI_TURN = "deploy/configs/guess-number.yaml"


def test_the_eval_plan_is_the_jobs_services_without_the_learner_unless_asked():
    job = load_job_config(MULTI_TURN, ["rollout.replicas=2"])
    full = plan(job)
    without = eval_plan(job)
    assert without.main.name == "evaluator" and without.main.args == ("eval",)
    assert [p.name for p in without.services] == [
        p.name for p in full.services if p.role != "learner"
    ]
    assert {"environment", "reward", "rollout0", "rollout1"} <= set(without.names())
    assert set(without.main.waits_for) == {p.name for p in without.services}
    with_learner = eval_plan(job, learner=True)
    assert [p.name for p in with_learner.services] == [p.name for p in full.services]
    assert "learner" in with_learner.main.waits_for
