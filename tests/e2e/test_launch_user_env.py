"""A user environment, defined in a module outside the package, trains through
``deploy/launch.sh``: the launcher starts the environment service with it (allow-listed in
``environment.envs``), the coordinator runs multi-turn episodes against it, and the learner
trains the trajectories."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hybridflow.coordinator.metrics import read_step_lines

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "deploy" / "launch.sh"
ENV = "my_user_env:Retry"

USER_MODULE = textwrap.dedent(
    """
    from hybridflow.envs.base import Message, StepResult

    class Retry:
        def reset(self, task):
            self.truth, self.tries = task.ground_truth, 0
            return (Message("user", task.prompt),)

        def step(self, action):
            self.tries += 1
            if action.strip() == self.truth:
                return StepResult(reward=1.0, done=True, info={"success": True})
            if self.tries == 3:
                return StepResult(done=True)
            return StepResult(observation=(Message("user", "again"),), info={"tool_calls": 1})
    """
)


@pytest.mark.parametrize("max_staleness", [0, 2], ids=["sync", "async"])
def test_user_environment_trains_through_launch(tmp_path: Path, max_staleness: int) -> None:
    (tmp_path / "my_user_env.py").write_text(USER_MODULE)
    run = tmp_path / "run"
    args = [str(LAUNCH), "--run-dir", str(run)]
    for o in (
        f"coordinator.multi_turn.env={ENV}",
        "coordinator.multi_turn.max_turns=3",
        "coordinator.multi_turn.max_total_tokens=40",
        f"environment.envs=[{ENV}]",
        "coordinator.num_steps=3",
        "coordinator.prompts_per_step=8",
        "coordinator.group_size=4",
        f"coordinator.max_staleness={max_staleness}",
        "rollout.in_flight_weights=continue_new",  # weights may change inside an episode
    ):
        args += ["--set", o]
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    env.pop("HYBRIDFLOW_TOKEN", None)
    proc = subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=300)
    finally:  # a failed or hung run takes its whole process group (the services) with it
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, output
    assert (run / "environment.addr").exists()  # the service ran, not an in-process twin
    assert "environment" in (run / "logs" / "environment.log").read_text().lower()
    metrics = read_step_lines(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["batch/num_samples"] == 32
        assert 1.0 <= m["episode/turns/mean"] <= 3.0
        # the turns after a wrong answer exist: the trajectories hold observation tokens
        if m["episode/turns/mean"] > 1.0:
            assert m["episode/policy_token_frac"] < 1.0
            assert m["episode/tool_calls/mean"] > 0.0
        assert m["episode/success_rate"] == m["critic/score/mean"]  # the env's reward
    assert any(m["episode/turns/mean"] > 1.0 for m in metrics)
    trained = [json.loads(x) for x in (run / "trained.jsonl").read_text().splitlines()]
    assert len(trained) == 3 * 8
    # The staleness bound counts a trajectory's oldest policy token (versions per step: 1).
    for row in trained:
        assert row["version"] - 1 - row["generated_version"] <= max_staleness, row
