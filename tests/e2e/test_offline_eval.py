"""``hybridflow-coordinator eval`` end to end: a short quickstart run (which evaluates its
held-out set at steps 0, 2 and 4 and keeps resumable train states of steps 2 and 4), then
offline evaluations through real services: the run's final export, the train state of
step 2 (loaded by a learner and published to the replica), and the built-in base model.
Each must repeat the run's own evaluation of that step: same seeds, chunks and pin, so the
same samples. A step with no checkpoint is refused before anything starts."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "deploy" / "launch.sh"
SET = "arith-test"


def env() -> dict[str, str]:
    out = dict(os.environ, PYTHON=sys.executable)
    out.pop("HYBRIDFLOW_TOKEN", None)  # as a user runs it: each command makes its own token
    return out


def evaluate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hybridflow.main.coordinator", "eval", *args],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def same_metrics(offline: dict[str, float], online: dict[str, float]) -> None:
    """Every metric the run logged, but the evaluation's own wall time."""
    timed = f"eval/{SET}/seconds"
    assert set(offline) == set(online)
    assert {k: v for k, v in offline.items() if k != timed} == {
        k: v for k, v in online.items() if k != timed
    }


def recomputed(samples: list[dict], k: int) -> dict[str, float]:
    """pass@1, pass@k and majority@k counted from the samples themselves: the share of
    k-subsets of a prompt's completions holding a pass, and whether the most common answer
    (the last number, else the text; ties: the first seen) is one a passing completion gave."""

    def passes(scores: list[float], size: int) -> float:
        subsets = list(itertools.combinations(scores, size))
        return sum(any(s >= 1.0 for s in sub) for sub in subsets) / len(subsets)

    def answer(text: str) -> str:
        numbers = re.findall(r"-?\d+(?:\.\d+)?", text)
        return numbers[-1] if numbers else text.strip()

    def majority(completions: list[dict]) -> float:
        answers = [answer(c["text"]) for c in completions]
        winner = max(answers, key=lambda a: (answers.count(a), -answers.index(a)))
        return float(any(c["score"] >= 1.0 for c, a in zip(completions, answers) if a == winner))

    scores = [[c["score"] for c in s["completions"]] for s in samples]
    return {
        "pass@1": sum(passes(s, 1) for s in scores) / len(samples),
        f"pass@{k}": sum(passes(s, k) for s in scores) / len(samples),
        f"majority@{k}": sum(majority(s["completions"]) for s in samples) / len(samples),
    }


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("offline") / "run"
    overrides = [
        "coordinator.num_steps=4",
        "coordinator.checkpoint_every=2",
        "coordinator.eval.every=2",
    ]
    args = [str(LAUNCH), "--run-dir", str(run)]
    for o in overrides:
        args += ["--set", o]
    done = subprocess.run(args, cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run


def online(run_dir: Path) -> dict[int, dict[str, float]]:
    lines = [json.loads(s) for s in (run_dir / "eval.jsonl").read_text().splitlines()]
    return {r["step"]: r["metrics"] for r in lines if r["name"] == SET}


def test_offline_evaluations_repeat_the_runs_own(run_dir, tmp_path):
    logged = online(run_dir)
    assert sorted(logged) == [0, 2, 4]

    final = evaluate(str(run_dir))  # the newest checkpoint: step 4's export
    assert final.returncode == 0, final.stderr[-3000:]
    results = json.loads((run_dir / "eval" / "step_4" / "results.json").read_text())
    assert results["step"] == 4 and results["policy_version"] == 4
    assert results["model"].endswith("hf/step_00000004")
    same_metrics(results["sets"][SET], logged[4])
    lines = (run_dir / "eval" / "step_4" / "samples.jsonl").read_text().splitlines()
    samples = [json.loads(line) for line in lines]
    assert {c["policy_version"] for s in samples for c in s["completions"]} == {4}
    assert {len(s["completions"]) for s in samples} == {8}
    for name, value in recomputed(samples, 8).items():
        assert abs(results["sets"][SET][f"eval/{SET}/{name}"] - value) < 1e-9, name

    state = evaluate(str(run_dir), "--step", "2")  # no export: the learner loads the state
    assert state.returncode == 0, state.stderr[-3000:]
    assert "published to 1 replica" in state.stderr
    results = json.loads((run_dir / "eval" / "step_2" / "results.json").read_text())
    assert results["policy_version"] == 2 and results["model"].endswith("step_00000002/learner")
    same_metrics(results["sets"][SET], logged[2])

    base = evaluate("--model", "builtin:tiny", "--out", str(tmp_path / "base"))
    assert base.returncode == 0, base.stderr[-3000:]
    results = json.loads((tmp_path / "base" / "results.json").read_text())
    same_metrics(results["sets"][SET], logged[0])

    records = [json.loads(s) for s in (run_dir / "eval_offline.jsonl").read_text().splitlines()]
    assert [(r["step"], r["policy_version"]) for r in records] == [(4, 4), (2, 2)]
    assert (run_dir / "report" / "eval.png").is_file()
    samples = (run_dir / "eval" / "step_2" / "samples.jsonl").read_text().splitlines()
    assert len(samples) == int(logged[2][f"eval/{SET}/num_prompts"])


def test_a_step_without_a_checkpoint_is_refused_before_anything_starts(run_dir):
    refused = evaluate(str(run_dir), "--step", "3")
    assert refused.returncode == 2
    assert "step 3 has no checkpoint" in refused.stderr
    assert "exported: 4; train states: 2, 4" in refused.stderr
    assert not (run_dir / "eval" / "step_3").exists()


def test_a_multi_turn_job_is_evaluated_through_its_environment_service(tmp_path):
    out = tmp_path / "guess"
    done = evaluate(
        "--model",
        "builtin:tiny-tools",
        "--config",
        "deploy/configs/guess-number.yaml",
        "--set",
        'coordinator.eval.sets=[{name: guess, data: "builtin:guess"}]',
        "--set",
        "coordinator.eval.k=2",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "started environment" in done.stderr  # its own process, as the launcher starts it
    metrics = json.loads((out / "results.json").read_text())["sets"]["guess"]
    samples = (out / "samples.jsonl").read_text().splitlines()
    assert len(samples) == metrics["eval/guess/num_prompts"] > 0
    assert metrics["eval/guess/turns/mean"] > 1.0  # episodes of several turns were played
    assert 0.0 <= metrics["eval/guess/success_rate"] <= 1.0
    assert "eval/guess/tool_use_rate" in metrics
