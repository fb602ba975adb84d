"""Evaluation metrics against reference computations on fixed samples: pass@k against the
mean over every k-subset of the completions, majority@k against a vote counted by hand."""

from __future__ import annotations

import itertools
import math

import pytest

from hybridflow.coordinator.dataflow import ScoredGroup
from hybridflow.coordinator.episode_record import EpisodeRecord
from hybridflow.coordinator.eval_metrics import answer_of, majority_passes, pass_at_k, set_metrics
from hybridflow.types import Completion, ScoreResult

from .fakes import Record


def brute_pass_at_k(passed: list[bool], k: int) -> float:
    """The share of k-subsets of the completions holding at least one that passed."""
    subsets = list(itertools.combinations(passed, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_mean_over_every_k_subset(n):
    for c in range(n + 1):
        passed = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert math.isclose(pass_at_k(n, c, k), brute_pass_at_k(passed, k), abs_tol=1e-12)


def test_pass_at_k_refuses_impossible_counts():
    for n, c, k in [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_answers_and_the_majority_vote():
    assert answer_of("so \\boxed{12} and \\boxed{ 7 }") == "7"
    assert answer_of("3+4 is 7, not 8") == "8"
    assert answer_of("  seven ") == "seven"
    # "7" wins 3 to 2; a passing completion said 7.
    assert majority_passes(["7", "8", "7", "8", "7"], [True, False, True, False, True])
    # "8" wins; no passing completion said 8.
    assert not majority_passes(["8", "7", "8"], [False, True, False])
    # A tie goes to the answer seen first ("8"), which did not pass.
    assert not majority_passes(["8", "7"], [False, True])


def group(
    texts: list[str], scores: list[float], source: str = "arith", idx: int = 0
) -> ScoredGroup:
    completions = [
        Completion([ord(ch) for ch in text], [-0.1] * len(text), "stop" if i % 2 else "length", 3)
        for i, text in enumerate(texts)
    ]
    record = Record(f"p{idx}", [idx + 1], data_source=source, index=idx)
    return ScoredGroup(record, completions, [ScoreResult(s) for s in scores])


def decode(ids) -> str:
    return "".join(chr(int(i)) for i in ids)


def test_set_metrics_on_fixed_samples():
    groups = [
        group(["7", "8", "7", "9"], [1, 0, 1, 0], idx=0),  # c=2: pass@4 = 1, majority 7 passes
        group(["5", "6", "6", "6"], [1, 0, 0, 0], idx=1),  # c=1: majority 6 fails
        group(["1", "2", "3", "4"], [0, 0, 0, 0], idx=2),  # c=0
    ]
    metrics = set_metrics(groups, threshold=1.0, decode=decode)
    assert metrics["mean@4"] == pytest.approx(3 / 12)
    assert metrics["pass@1"] == pytest.approx((2 / 4 + 1 / 4 + 0) / 3)
    assert metrics["pass@4"] == pytest.approx((1 + 1 + 0) / 3)
    assert metrics["majority@4"] == pytest.approx(1 / 3)
    assert metrics["length/mean"] == 1.0
    assert metrics["finish/stop"] == 0.5 and metrics["finish/length"] == 0.5
    assert metrics["num_prompts"] == 3.0


def test_set_metrics_per_data_source_and_for_episodes():
    a = group(["1", "1"], [1, 1], source="a", idx=0)
    b = group(["2", "3"], [0, 1], source="b", idx=1)
    b.episodes = [
        EpisodeRecord(turns=2, tool_calls=1, success=False),
        EpisodeRecord(turns=4, success=True),
    ]
    a.episodes = [EpisodeRecord(turns=1, success=True), EpisodeRecord(turns=1, success=True)]
    metrics = set_metrics([a, b], threshold=1.0, decode=decode)
    assert metrics["a/pass@1"] == 1.0 and metrics["b/pass@1"] == 0.5
    assert metrics["pass@1"] == 0.75
    assert metrics["success_rate"] == 0.75
    assert metrics["turns/mean"] == 2.0
    assert metrics["tool_use_rate"] == 0.25
    assert metrics["b/success_rate"] == 0.5
