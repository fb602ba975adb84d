"""The seed API: RLTrainer(...).step(prompts) over the in-process twins."""

import math

import pytest

import hybridflow
from hybridflow import RLTrainer
from hybridflow.testing import mock_reward


def test_version_string():
    assert hybridflow.__version__.startswith("0.1.0a")


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_step_returns_losses_and_reward(tiny_model_path, algo):
    trainer = RLTrainer(actor=tiny_model_path, reward_fn=mock_reward, algo=algo, lr=1e-3)
    result = trainer.step(prompts=["1+2=", "3+4=", "5+5="])
    m = result.metrics
    assert {"policy_loss", "value_loss", "reward_mean"} <= set(m)
    assert all(math.isfinite(m[k]) for k in ("policy_loss", "value_loss", "reward_mean"))
    assert 0.0 <= m["reward_mean"] <= 1.0
    assert result.policy_version == 1
    assert trainer.rollout.status().policy_version == 1  # weights synced to the rollout twin
    if algo == "ppo":
        assert m["value_loss"] > 0  # a freshly initialised critic is wrong
    trainer.close()


def test_reward_fn_sees_prompt_and_response(tiny_model_path):
    seen = []

    def reward(prompt, response):
        seen.append((prompt, response))
        return 1.0

    trainer = RLTrainer(actor=tiny_model_path, reward_fn=reward, group_size=2)
    result = trainer.step(prompts=["2+2="])
    assert [p for p, _ in seen] == ["2+2=", "2+2="]
    assert result.metrics["reward_mean"] == 1.0
    with pytest.raises(ValueError, match="prompts"):
        trainer.step(prompts=[])


def test_mock_reward():
    assert mock_reward("3+4=", " 7") == 1.0 and mock_reward("3+4=", "8") == 0.0
    assert mock_reward("hello", "a1") == 0.5
