"""Multi-turn runs survive their services' deaths: SIGKILL the environment service or the
rollout replica while episodes are in flight; the launcher restarts it, the episodes it held
restart from their tasks, and the run completes with 0 tasks lost and 0 trained twice. A
killed learner stops the job; ``--resume`` continues it from the last checkpoint with the
same audit (each task trained once per epoch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridflow.coordinator.metrics import read_step_lines
from tests.fault.harness import Trial, audit, run_trial

ENV = "tests.fault.multi_turn_env:RetryArithEnv"
NUM_STEPS = 8  # the kill comes after step 3; 5 steps after it see the restarted service through
MULTI_TURN = (
    f"coordinator.num_steps={NUM_STEPS}",
    f"coordinator.multi_turn.env={ENV}",
    "coordinator.multi_turn.max_turns=3",
    "coordinator.multi_turn.max_total_tokens=48",
    f"environment.envs=[{ENV}]",
)


@pytest.mark.parametrize(
    "victim",
    [
        "environment",
        # A killed learner stops the job and --resume continues it: the default suite checks
        # that through launch in tests/fault/test_kill.py::test_kill_once[learner], and a
        # multi-turn run's resume on the real learner in tests/fault/test_resume_matrix_twins.py.
        pytest.param("learner", marks=pytest.mark.slow),
        pytest.param("rollout", marks=pytest.mark.slow),
    ],
)
def test_kill_mid_episode_loses_nothing(victim: str, tmp_path: Path) -> None:
    trial = Trial(victim, 3, tmp_path / victim, extra=MULTI_TURN, hold_dir=tmp_path / "hold")
    run_trial(trial)
    resumed = victim == "learner"
    assert trial.exit_codes[-1] == 0 and len(trial.exit_codes) == 1 + resumed, trial.output
    counts = audit(trial.run_dir, NUM_STEPS)
    assert counts["lost"] == 0 and counts["doubled"] == 0
    metrics = read_step_lines(trial.run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, NUM_STEPS + 1))
    assert max(m["episode/turns/max"] for m in metrics) >= 2  # episodes did take turns
    if resumed:
        return  # the learner is not restarted: the job stopped and was resumed
    supervisor = [
        json.loads(x) for x in (trial.run_dir / "supervisor.jsonl").read_text().splitlines()
    ]
    assert any(e["event"] == "restarted" and e["service"].startswith(victim) for e in supervisor)
    restarted = metrics[-1]["episode/restarted"] + metrics[-1]["async/requeued"]
    assert restarted >= 1, "the kill interrupted no episode"


AGENT = "hybridflow.envs.calc_agent:calc_agent"
AGENT_JOB = (
    f"coordinator.num_steps={NUM_STEPS}",
    "model=builtin:tiny-tools",
    "coordinator.data=builtin:calc",
    f"coordinator.multi_turn.agent={AGENT}",
    f"environment.envs=[{AGENT}]",
    "coordinator.sampling.max_new_tokens=48",
    "environment.endpoint.max_response_tokens=320",
    "environment.agent_timeout_s=60",
    "coordinator.eval.sets=[]",
)


# Slow (about 40 s each): the default suite keeps the multi-turn loop's kill above, and the
# agents' bounds in tests/integration/test_agent_bounds.py.
@pytest.mark.slow
@pytest.mark.parametrize("victim", ["environment", "coordinator"])
def test_kill_mid_agent_episode_loses_nothing(victim: str, tmp_path: Path) -> None:
    """Agent episodes (the OpenAI-compatible endpoint and the agents live in the environment
    service): SIGKILL that process while agents talk to it, or the coordinator (then
    ``--resume``); the run completes, each task trained once."""
    trial = Trial(victim, 3, tmp_path / victim, extra=AGENT_JOB)
    run_trial(trial)
    resumed = victim == "coordinator"
    assert trial.exit_codes[-1] == 0 and len(trial.exit_codes) == 1 + resumed, trial.output
    counts = audit(trial.run_dir, NUM_STEPS)
    assert counts["lost"] == 0 and counts["doubled"] == 0
    metrics = read_step_lines(trial.run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, NUM_STEPS + 1))
    assert max(m["episode/turns/max"] for m in metrics) >= 2  # agents did call the tool
    if resumed:
        return
    supervisor = [
        json.loads(x) for x in (trial.run_dir / "supervisor.jsonl").read_text().splitlines()
    ]
    assert any(e["event"] == "restarted" and e["service"] == "environment" for e in supervisor)
    assert metrics[-1]["episode/restarted"] + metrics[-1]["async/requeued"] >= 1
