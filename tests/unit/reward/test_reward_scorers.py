"""Registry lookup, user scorers by import path, and per-item error isolation in batches."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.services.reward.config import RewardConfig
from hybridflow.services.reward.registry import ScorerRegistry, load_scorer_function
from hybridflow.services.reward.scorers import ERROR_KINDS, RewardScorer, score_batch
from hybridflow.types import ScoreItem, ScoreResult

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
USER_SCORERS_FILE = FIXTURES / "user_scorers.py"


@pytest.fixture
def user_scorers_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


@pytest.mark.parametrize(
    ("data_source", "expected"),
    [
        ("arith", "arith"),
        ("gsm8k", "gsm8k"),
        ("openai/gsm8k", "openai/gsm8k"),
        ("openai/gsm8k_socratic", "openai/gsm8k"),
        ("lighteval/MATH", "lighteval/MATH"),
        ("DigitalLearningGmbH/MATH-lighteval", "DigitalLearningGmbH/MATH-lighteval"),
        ("math_dapo", "math"),
        ("arith_hard", "arith"),
    ],
)
def test_resolve_exact_then_longest_prefix(data_source: str, expected: str) -> None:
    scorer = ScorerRegistry().resolve(data_source)
    assert scorer is not None
    assert scorer.name == expected
    assert scorer.requires_ground_truth


def test_resolve_unknown_is_none() -> None:
    assert ScorerRegistry().resolve("squad") is None
    assert ScorerRegistry().resolve("") is None


def test_builtin_batch_scores() -> None:
    items = [
        ScoreItem("arith", "7", "7"),
        ScoreItem("arith", "8", "7"),
        ScoreItem("openai/gsm8k", "The answer is #### 1,234", "1234"),
        ScoreItem("DigitalLearningGmbH/MATH-lighteval", "\\boxed{\\dfrac12}", "\\frac{1}{2}"),
        ScoreItem("lighteval/MATH", "\\boxed{3}", "4"),
    ]
    assert score_batch(items) == [
        ScoreResult(1.0),
        ScoreResult(0.0),
        ScoreResult(1.0),
        ScoreResult(1.0),
        ScoreResult(0.0),
    ]


def test_config_reaches_builtin_scorers() -> None:
    config = RewardConfig(format_score=0.25, gsm8k_method="flexible")
    items = [ScoreItem("gsm8k", "it is 12", "12"), ScoreItem("gsm8k", "it is 11", "12")]
    assert [r.score for r in score_batch(items, config)] == [1.0, 0.25]


def test_user_scorer_by_import_path(user_scorers_on_path: None) -> None:
    config = RewardConfig(
        scorers={"len": "user_scorers:length_score", "gsm8k": "user_scorers:contains_truth"}
    )
    items = [
        ScoreItem("len", "abcd", None, extra_info={"scale": 0.5}),
        ScoreItem("len_v2", "abc", None),  # prefix match reaches the user scorer
        ScoreItem("gsm8k", "I think 42", "42"),  # the user scorer overrides the builtin
        ScoreItem("gsm8k", "I think 41", "42"),
    ]
    assert [r.score for r in score_batch(items, config)] == [2.0, 3.0, 1.0, 0.0]


def test_user_scorer_by_file_path() -> None:
    config = RewardConfig(scorers={"len": f"{USER_SCORERS_FILE}:length_score"})
    assert score_batch([ScoreItem("len", "xyz", None)], config) == [ScoreResult(3.0)]


def test_batch_isolates_each_failing_item(user_scorers_on_path: None) -> None:
    config = RewardConfig(
        scorers={"boom": "user_scorers:always_raises", "nan": "user_scorers:returns_nan"}
    )
    scorer = RewardScorer(config)
    items = [
        ScoreItem("arith", "7", "7"),
        ScoreItem("boom", "x", "1"),
        ScoreItem("squad", "x", "1"),
        ScoreItem("arith", "7", "7"),
        ScoreItem("gsm8k", "#### 3", None),
        ScoreItem("nan", "x", None),
        ScoreItem("openai/gsm8k", "#### 3", "3"),
    ]
    results = scorer.score_batch(items)
    assert [r.score for r in results] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    assert [r.error is None for r in results] == [True, False, False, True, False, False, True]
    errors = [r.error or "" for r in results]
    assert errors[1].startswith("item 1: ")
    assert "'boom'" in errors[1] and "RuntimeError: scorer blew up" in errors[1]
    assert errors[2].startswith("item 2: ") and "unknown data_source 'squad'" in errors[2]
    assert errors[4].startswith("item 4: ") and "needs a ground truth" in errors[4]
    assert errors[5].startswith("item 5: ") and "non-finite score nan" in errors[5]
    assert scorer.error_counts == {
        "unknown_data_source": 1,
        "missing_ground_truth": 1,
        "scorer_exception": 1,
        "bad_return_type": 0,
        "non_finite_score": 1,
        "too_long": 0,
        "model_error": 0,
        "no_component": 0,
    }
    assert scorer.num_scored == 7


def test_bad_return_type_and_invalid_ground_truth_are_item_errors(
    user_scorers_on_path: None,
) -> None:
    scorer = RewardScorer(RewardConfig(scorers={"txt": "user_scorers:returns_text"}))
    results = scorer.score_batch([ScoreItem("txt", "a", None), ScoreItem("arith", "7", "seven")])
    assert results[0].error is not None and "returned str '1.0'" in results[0].error
    assert results[1].error is not None and "must be an integer" in results[1].error
    assert scorer.error_counts["bad_return_type"] == 1
    assert scorer.error_counts["scorer_exception"] == 1
    assert set(scorer.error_counts) == set(ERROR_KINDS)


def test_empty_data_source_uses_default_or_errors() -> None:
    item = ScoreItem("", "7", "7")
    assert score_batch([item], RewardConfig(default_data_source="arith")) == [ScoreResult(1.0)]
    [result] = score_batch([item])
    assert result.error == "item 0: empty data_source and no reward.default_data_source configured"


def test_threaded_scoring_keeps_order() -> None:
    scorer = RewardScorer(RewardConfig(score_workers=3))
    items = [ScoreItem("arith", str(i % 5), "3") for i in range(40)]
    results = scorer.score_batch(items)
    scorer.close()
    assert [r.score for r in results] == [1.0 if i % 5 == 3 else 0.0 for i in range(40)]


def test_batch_over_max_size_is_rejected() -> None:
    scorer = RewardScorer(RewardConfig(max_batch_size=2))
    with pytest.raises(ValueError, match="max_batch_size"):
        scorer.score_batch([ScoreItem("arith", "1", "1")] * 3)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("user_scorers", "expected 'package.module:function'"),
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz': ModuleNotFoundError"),
        ("user_scorers:missing", "has no attribute 'missing'"),
        ("user_scorers:NOT_CALLABLE", "is not callable"),
        ("user_scorers:takes_one_arg", "must accept (response, ground_truth, extra_info)"),
        ("/no/such/file.py:f", "does not exist"),
    ],
)
def test_bad_import_path_fails_at_registration(
    user_scorers_on_path: None, path: str, message: str
) -> None:
    with pytest.raises(ValueError) as excinfo:
        load_scorer_function(path)
    assert message in str(excinfo.value)
    if ":" in path:
        with pytest.raises(ValueError, match=r"reward\.scorers\['mine'\]"):
            RewardScorer(RewardConfig(scorers={"mine": path}))


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="reward.score_workers"):
        RewardConfig(score_workers=0).validate()
    with pytest.raises(ValueError, match="reward.gsm8k_method"):
        RewardConfig(gsm8k_method="loose").validate()
    with pytest.raises(ValueError, match="reward.max_batch_size"):
        RewardConfig(max_batch_size=0).validate()
    with pytest.raises(ValueError, match=r"reward.scorers\['x'\]"):
        RewardConfig(scorers={"x": "no_colon"}).validate()


def test_reward_core_imports_without_torch_or_grpc() -> None:
    code = (
        "import sys, hybridflow.services.reward.scorers, hybridflow.services.reward.config\n"
        "assert 'torch' not in sys.modules and 'grpc' not in sys.modules, sorted(sys.modules)\n"
    )
    root = str(Path(__file__).resolve().parents[3])
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env={"PYTHONPATH": root})
