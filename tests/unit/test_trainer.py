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
    rewards = []

    def reward(prompt, response):
        rewards.append(mock_reward(prompt, response))
        return rewards[-1]

    trainer = RLTrainer(actor=tiny_model_path, reward_fn=reward, algo=algo, optimizer={"lr": 1e-3})
    result = trainer.step(prompts=["1+2=", "3+4=", "5+5="])
    m = result.metrics
    # The seed's names are the learner's own numbers, not defaults filled in by the trainer.
    assert m["policy_loss"] == m["actor/pg_loss"] and math.isfinite(m["policy_loss"])
    assert m["actor/grad_norm"] > 0  # a real backward pass ran
    assert len(rewards) == 3 * trainer.params.n  # every sample was scored ...
    assert m["reward_mean"] == pytest.approx(sum(rewards) / len(rewards))  # ... and averaged
    assert result.policy_version == 1
    assert trainer.rollout.status().policy_version == 1  # weights synced to the rollout twin
    if algo == "ppo":
        assert m["value_loss"] == m["critic/vf_loss"] > 0  # a freshly initialised critic is wrong
    else:
        assert "critic/vf_loss" not in m and m["value_loss"] == 0.0  # no critic
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
