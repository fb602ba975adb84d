"""reward.components: weighted sums by hand, data-source filters, the none-applies and
component-failure errors, per-component scores, config validation naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow.config.loader import ConfigError, from_dict
from hybridflow.coordinator.dataflow import component_means
from hybridflow.services.reward.config import RewardComponent, RewardConfig
from hybridflow.services.reward.scorers import RewardScorer
from hybridflow.types import ScoreItem, ScoreResult

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LENGTH = f"{FIXTURES / 'user_scorers.py'}:length_score"


def scorer(*components: RewardComponent, score_workers: int = 1) -> RewardScorer:
    return RewardScorer(
        RewardConfig(
            scorers={"len": LENGTH}, components=list(components), score_workers=score_workers
        )
    )


@pytest.mark.parametrize("score_workers", [1, 3])
def test_weighted_sum_of_the_components_that_apply(score_workers: int) -> None:
    s = scorer(
        RewardComponent(name="rule", weight=0.5),
        RewardComponent(name="length", scorer="len", weight=-0.25, data_sources=["arith"]),
        RewardComponent(name="gsm", scorer="gsm8k", weight=2.0, data_sources=["openai/"]),
        score_workers=score_workers,
    )
    results = s.score_batch(
        [
            ScoreItem("arith", "12", "12"),  # rule 1, length 2: 0.5 - 0.5
            ScoreItem("arith", "7", "12"),  # rule 0, length 1: -0.25
            ScoreItem("openai/gsm8k", "so #### 3", "3"),  # rule 1, gsm 1: 0.5 + 2
        ]
    )
    assert results == [
        ScoreResult(0.0, components={"rule": 1.0, "length": 2.0}),
        ScoreResult(-0.25, components={"rule": 0.0, "length": 1.0}),
        ScoreResult(2.5, components={"rule": 1.0, "gsm": 1.0}),
    ]
    assert s.num_scored == 3 and sum(s.error_counts.values()) == 0


def test_an_item_no_component_applies_to_is_an_error() -> None:
    s = scorer(
        RewardComponent(name="a", data_sources=["arith"]),
        RewardComponent(name="g", data_sources=["gsm8k"]),
    )
    results = s.score_batch([ScoreItem("arith", "3", "3"), ScoreItem("squad", "x", "x")])
    assert results[0] == ScoreResult(1.0, components={"a": 1.0})
    assert results[1].score == 0.0 and results[1].components == {}
    assert results[1].error == (
        "item 1: no reward component applies to data_source 'squad' (components: ['a', 'g'])"
    )
    assert s.error_counts["no_component"] == 1


def test_a_failing_component_fails_its_item_only_and_is_named() -> None:
    s = scorer(RewardComponent(name="rule"), RewardComponent(name="length", scorer="len"))
    results = s.score_batch([ScoreItem("arith", "3", None), ScoreItem("arith", "3", "3")])
    assert results[0].score == 0.0 and results[0].components == {}
    assert results[0].error is not None
    assert results[0].error.startswith("item 0: component 'rule': data_source 'arith'")
    assert "needs a ground truth" in results[0].error
    assert results[1] == ScoreResult(2.0, components={"rule": 1.0, "length": 1.0})
    assert s.error_counts["missing_ground_truth"] == 1


def test_without_components_scores_carry_no_component_scores() -> None:
    assert RewardScorer().score_batch([ScoreItem("arith", "3", "3")]) == [ScoreResult(1.0)]


def test_an_unregistered_scorer_name_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match=r"reward.components\[0\].scorer: 'nope' is not"):
        scorer(RewardComponent(name="x", scorer="nope"))


def test_component_means_per_name_over_the_results_that_carry_it() -> None:
    results = [
        ScoreResult(1.0, components={"rule": 1.0, "rm": 2.0}),
        ScoreResult(0.0, components={"rule": 0.0}),
        ScoreResult(0.0, error="boom"),
    ]
    assert component_means(results) == {"reward/rm/mean": 2.0, "reward/rule/mean": 0.5}
    assert component_means([ScoreResult(1.0)]) == {}


@pytest.mark.parametrize(
    ("components", "message"),
    [
        ([{"name": ""}], r"reward.components\[0\].name: must be a non-empty string"),
        ([{"name": "a"}, {"name": "a"}], r"reward.components\[1\].name: 'a' is used by an"),
        (
            [{"name": "a", "weight": float("inf")}],
            r"reward.components\[0\].weight: must be a finite",
        ),
        ([{"name": "a", "kind": "model"}], r"reward.components\[0\].model: required for a model"),
        ([{"name": "a", "kind": "oracle"}], r"reward.components\[0\].kind' must be one of"),
        ([{"name": "a", "model": "m"}], r"reward.components\[0\].model: only a model component"),
        (
            [{"name": "a", "kind": "model", "model": "m", "scorer": "arith"}],
            r"reward.components\[0\].scorer: only a rule component",
        ),
        (
            [{"name": "a", "kind": "model", "model": "m", "batch_size": 0}],
            r"reward.components\[0\].batch_size: must be >= 1",
        ),
        (
            [{"name": "a", "kind": "model", "model": "m", "device": "tpu"}],
            r"reward.components\[0\].device: must be cpu, cuda or cuda:N",
        ),
        ([{"name": "a", "data_sources": [""]}], r"reward.components\[0\].data_sources: entries"),
    ],
)
def test_component_validation_names_the_key(components: list[dict], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_dict(RewardConfig, {"components": components}, prefix="reward.")


def test_a_valid_components_config_loads() -> None:
    cfg = from_dict(
        RewardConfig,
        {
            "components": [
                {"name": "rule", "kind": "rule", "weight": 0.5},
                {"name": "rm", "kind": "model", "model": "builtin:tiny-rm", "batch_size": 64},
            ]
        },
    )
    assert [c.name for c in cfg.model_components()] == ["rm"]
    assert cfg.components[1].device == "cpu" and cfg.components[1].weight == 1.0
