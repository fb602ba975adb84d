"""Offline evaluation (``coordinator/offline_eval.py``) with fake services: the results are
labelled with the checkpoint's version, say what was evaluated, and are the metrics that
samples.jsonl recomputes by counting (every k-subset for pass@k, the most common answer for
majority@k); only complete sets reach the run's eval_offline.jsonl."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path

from hybridflow.coordinator.eval_config import EvalConfig, EvalSet
from hybridflow.coordinator.evaluation import EvalSet as LoadedSet
from hybridflow.coordinator.evaluation import read_records
from hybridflow.coordinator.offline_eval import (
    EvalClients,
    evaluate_once,
    summary_lines,
    write_results,
)
from hybridflow.coordinator.report import OFFLINE_EVAL_FILE
from hybridflow.types import Completion

from .fakes import FakeReward, FakeRollout, records


class Varied(FakeRollout):
    """Answers prompt [x] with completions [x, (x + j*j) % 3] (j = 0..n-1): the reward passes
    those ending in 0, so prompts pass 0 to n of their k samples, and the answers repeat."""

    def generate(self, prompts, params, request_id=""):
        self.requests.append((len(prompts), params))
        return [
            [
                Completion([p[0], (p[0] + j * j) % 3], [-0.5, -0.5], "stop", 0)
                for j in range(params.n)
            ]
            for p in prompts
        ]


class Stuck(FakeRollout):
    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def generate(self, prompts, params, request_id=""):
        self.release.wait(30)
        return super().generate(prompts, params, request_id)


def decode(ids) -> str:
    return " ".join(f"answer {int(t)}" for t in ids[-1:])


def clients(rollouts) -> EvalClients:
    return EvalClients(rollouts, FakeReward(), decode)


def evaluate(rollouts, tmp_path: Path, **eval_kw):
    cfg = EvalConfig(
        sets=[EvalSet("held", "x"), EvalSet("other", "y")], k=4, prompts_per_request=3, **eval_kw
    )
    sets = [LoadedSet("held", records(7)), LoadedSet("other", records(2))]
    return evaluate_once(
        cfg,
        sets,
        clients(rollouts),
        max_new_tokens=4,
        seed=0,
        out_dir=tmp_path / "out",
        model="/ckpt/hf/step_00000012",
        step=12,
        policy_version=12,
    )


def pass_at(scores: list[float], k: int) -> float:
    """The share of k-subsets of the samples holding a pass (what pass@k estimates)."""
    subsets = list(itertools.combinations(scores, k))
    return sum(any(s >= 1.0 for s in sub) for sub in subsets) / len(subsets)


def majority(completions: list[dict]) -> float:
    answers = [c["text"] for c in completions]
    top = max(answers.count(a) for a in answers)
    winner = next(a for a in answers if answers.count(a) == top)
    return float(any(c["score"] >= 1.0 for c in completions if c["text"] == winner))


def test_results_are_labelled_and_recomputed_from_the_samples(tmp_path):
    result = evaluate([Varied(), Varied()], tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = write_results(result, tmp_path / "out", decode, run_dir)

    summary = json.loads(path.read_text())
    assert (summary["model"], summary["step"], summary["policy_version"]) == (
        "/ckpt/hf/step_00000012",
        12,
        12,
    )
    assert summary["complete"] and set(summary["sets"]) == {"held", "other"}
    samples = [
        json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()
    ]
    for name, num in (("held", 7), ("other", 2)):
        metrics = summary["sets"][name]
        mine = [s for s in samples if s["set"] == name]
        assert sorted(s["index"] for s in mine) == list(range(num))
        assert metrics[f"eval/{name}/num_prompts"] == num
        assert metrics[f"eval/{name}/policy_version"] == 12.0
        for k in (1, 4):
            expected = sum(pass_at([c["score"] for c in s["completions"]], k) for s in mine) / num
            assert abs(metrics[f"eval/{name}/pass@{k}"] - expected) < 1e-9
        expected = sum(majority(s["completions"]) for s in mine) / num
        assert abs(metrics[f"eval/{name}/majority@4"] - expected) < 1e-9
        scores = [c["score"] for s in mine for c in s["completions"]]
        assert abs(metrics[f"eval/{name}/mean@4"] - sum(scores) / len(scores)) < 1e-9
    held = summary["sets"]["held"]
    assert 0.0 < held["eval/held/pass@1"] < held["eval/held/pass@4"] < 1.0  # not a flat case

    records_ = read_records(run_dir / OFFLINE_EVAL_FILE)
    assert [(r.step, r.name, r.policy_version) for r in records_] == [
        (12, "held", 12),
        (12, "other", 12),
    ]
    assert "policy v12" in summary_lines(result)[0]


def test_a_set_cut_by_the_deadline_is_written_but_not_recorded_for_the_run(tmp_path):
    release = threading.Event()
    try:
        result = evaluate([Stuck(release)], tmp_path, timeout_s=0.2)
    finally:
        release.set()
    assert not result.complete
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_results(result, tmp_path / "out", decode, run_dir)
    summary = json.loads((tmp_path / "out" / "results.json").read_text())
    assert summary["complete"] is False
    assert not (run_dir / OFFLINE_EVAL_FILE).read_text()
    assert any("timed out" in line for line in summary_lines(result))
