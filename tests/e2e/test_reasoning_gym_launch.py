"""A reasoning-gym task end to end: deploy/launch.sh trains the built-in model on
``reasoning_gym:basic_arithmetic`` and evaluates a held-out draw of it (another seed), the
real reward service scoring every sample with the task's own scorer (the entry crosses gRPC
in extra_info): no item errors, in training or in the evaluations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hybridflow.coordinator.metrics import read_step_lines

REPO = Path(__file__).resolve().parents[2]
TASK = "reasoning_gym:basic_arithmetic?max_terms=2&max_digits=1&operators=[+]"


def test_a_reasoning_gym_task_trains_and_evaluates_through_the_services(tmp_path):
    run = tmp_path / "run"
    sets = f'[{{name: rg-test, data: "{TASK}&seed=1234", size: 8}}]'
    args = [str(REPO / "deploy" / "launch.sh"), "--run-dir", str(run)]
    for o in (
        "coordinator.num_steps=3",
        f"coordinator.data={TASK}",
        f"coordinator.eval.sets={sets}",
    ):
        args += ["--set", o]
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("HYBRIDFLOW_TOKEN", None)
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = read_step_lines(run / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["reward/num_errors"] == 0 for s in steps)
    assert any(s["critic/score/max"] > 0 for s in steps)  # the task's scorer gave credit
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 3]
    assert all(e["metrics"]["eval/rg-test/num_prompts"] == 8 for e in evals)
    assert all(e["metrics"]["eval/rg-test/num_errors"] == 0 for e in evals)
