"""The ``math_verify`` scorer (Hugging Face's math-verify, in child processes with a
deadline): the cases math-verify's own documentation gives (a set union against its
elements, LaTeX against a plain expression, a fraction against a decimal), intervals,
wrong and missing answers; ``reward.math_method`` routes verl's MATH names to it; an answer
that would hang sympy fails alone at its deadline, the rest of its batch scored; the
scoring processes load no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hybridflow.services.reward.config import RewardConfig
from hybridflow.services.reward.math_verify_scorer import BoundedMathVerify
from hybridflow.services.reward.scorers import RewardScorer
from hybridflow.types import ScoreItem

# (response, ground truth, score with format_score 0.1)
CASES = [
    # math-verify's README: the gold's boxed set union is the answer's set
    ("${1,2,3,4}$", "The answer is \\boxed{${1,3} \\cup {2,4}$} What if I add some bad", 1.0),
    # its "simple expressions" and LaTeX forms of one polynomial
    ("$(x+1)^2$", "$x^2 + 2x + 1$", 1.0),
    ("The answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("so $x = \\frac{1}{2}$", "1/2", 1.0),
    ("$(1,2]$", "(1,2]", 1.0),
    ("$[1,2]$", "(1,2]", 0.1),  # an answer, not the right interval: the format score
    ("The answer is \\boxed{3}", "\\frac{1}{2}", 0.1),
    ("no answer here", "1/2", 0.0),
]


@pytest.fixture(scope="module")
def checker():
    bounded = BoundedMathVerify(workers=1, timeout_s=60.0, format_score=0.1)
    yield bounded
    bounded.close()


@pytest.mark.parametrize(("response", "ground_truth", "expected"), CASES)
def test_the_documented_cases(checker, response, ground_truth, expected):
    assert checker(response, ground_truth, {}) == expected


def test_math_method_routes_verls_math_names_to_math_verify():
    items = [  # the same set in another order, the same number written another way
        ScoreItem("lighteval/MATH", "\\boxed{\\{2,1\\}}", "\\{1,2\\}"),
        ScoreItem("lighteval/MATH", "\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}"),
    ]
    rules = RewardScorer(RewardConfig())
    verified = RewardScorer(RewardConfig(math_method="math_verify"))
    try:
        assert [r.score for r in rules.score_batch(items)] == [0.0, 0.0]  # compared as text
        assert [r.score for r in verified.score_batch(items)] == [1.0, 1.0]
    finally:
        rules.close()
        verified.close()


def test_an_answer_past_the_deadline_fails_alone_and_the_batch_goes_on():
    scorer = RewardScorer(RewardConfig(math_verify_timeout_s=1.0))
    try:
        results = scorer.score_batch(
            [
                ScoreItem("math_verify", "\\boxed{3}", "3"),
                ScoreItem("math_verify", "\\boxed{9^{9^{9^{9^{9}}}}}", "1"),  # sympy does not end
                ScoreItem("math_verify", "\\boxed{4}", "4"),
            ]
        )
        assert [r.score for r in results] == [1.0, 0.0, 1.0]
        assert results[0].error is None and results[2].error is None
        assert results[1].error is not None and "longer than 1s" in results[1].error
        assert scorer.registry.math_verify.num_killed == 1
        assert scorer.error_counts["scorer_exception"] == 1
    finally:
        scorer.close()


CHILD_IMPORTS = """
import sys

if __name__ == "__main__":
    from hybridflow.services.reward.math_verify_scorer import BoundedMathVerify

    checker = BoundedMathVerify(1, 60.0)
    assert checker("\\\\boxed{2}", "2", {}) == 1.0
    print("LOADED", sorted(m for m in ("torch", "transformers", "numpy") if m in sys.modules))
    checker.close()
"""


def test_scoring_with_math_verify_loads_no_torch():
    done = subprocess.run(
        [sys.executable, "-c", CHILD_IMPORTS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "LOADED []" in done.stdout
