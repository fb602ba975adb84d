"""A user advantage estimator, defined in a module outside the package, trains through
``deploy/launch.sh`` (the learner imports it at start-up from PYTHONPATH)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hybridflow.coordinator.metrics import read_step_lines

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "deploy" / "launch.sh"

USER_MODULE = textwrap.dedent(
    """
    def centred(inputs, options):
        scores = inputs.token_rewards.sum(-1)
        adv = (scores - scores.mean()).unsqueeze(-1) * inputs.response_mask
        return adv, adv
    """
)


def _launch(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    args = [str(LAUNCH), "--run-dir", str(tmp_path / "run")]
    for o in overrides:
        args += ["--set", o]
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    env.pop("HYBRIDFLOW_TOKEN", None)
    return subprocess.run(
        args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        start_new_session=True,
    )  # fmt: skip


def test_user_estimator_trains_through_launch(tmp_path: Path) -> None:
    (tmp_path / "my_user_algos.py").write_text(USER_MODULE)
    out = _launch(
        tmp_path,
        "learner.advantage_estimator=my_user_algos:centred",
        "coordinator.num_steps=3",
        "coordinator.prompts_per_step=8",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = read_step_lines(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2, 3]
    for m in lines:
        # The batch-mean baseline (not GRPO's group statistics): max advantage = max - mean.
        expected = m["critic/score/max"] - m["critic/score/mean"]
        assert m["critic/advantages/max"] == pytest.approx(expected, abs=1e-5)
    assert (
        "advantage_estimator: my_user_algos:centred"
        in (tmp_path / "run" / "config.yaml").read_text()
    )


def test_bad_user_estimator_fails_at_learner_start(tmp_path: Path) -> None:
    (tmp_path / "my_user_algos.py").write_text(USER_MODULE)
    out = _launch(tmp_path, "learner.advantage_estimator=my_user_algos:missing")
    assert out.returncode != 0
    log = (tmp_path / "run" / "logs" / "learner.log").read_text()
    assert "learner.advantage_estimator: advantage estimator path" in log
    assert "has no attribute 'missing'" in log
