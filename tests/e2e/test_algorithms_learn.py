"""The registered estimators and losses learn builtin:arith in-process (RLTrainer, 30 steps).

Seeded and single-threaded, so each curve is deterministic; the check is a rise of the
reward (last 10 steps against the first 5), not a final level. GSPO and CISPO run two epochs
per batch: with one update per batch the ratio is 1 and CISPO's gradient equals PPO clip's.
CISPO runs at half the learning rate: it keeps the gradient of tokens PPO's clip drops, and at
1e-3 with two epochs its reward collapsed (measured: 0.3 -> 0.1-0.4) while PPO clip reached 0.9.
"""

from __future__ import annotations

import statistics

import pytest

from hybridflow import RLTrainer
from hybridflow.data.arith import make_arith_rows
from hybridflow.testing import mock_reward
from hybridflow.types import SamplingParams

NUM_STEPS = 30
PROMPTS_PER_STEP = 16


@pytest.mark.parametrize(
    ("estimator", "loss", "lr", "ppo_epochs"),
    [
        ("rloo", "ppo_clip", 1e-3, 1),
        ("reinforce_plus_plus", "ppo_clip", 1e-3, 1),
        ("reinforce_plus_plus_baseline", "ppo_clip", 1e-3, 1),
        ("grpo", "gspo", 1e-3, 2),
        ("grpo", "cispo", 5e-4, 2),
    ],
)
def test_reward_rises_on_arith(estimator: str, loss: str, lr: float, ppo_epochs: int) -> None:
    prompts = [row["prompt"] for row in make_arith_rows(NUM_STEPS * PROMPTS_PER_STEP, seed=0)]
    trainer = RLTrainer(
        actor="builtin:tiny",
        reward_fn=mock_reward,
        group_size=8,
        sampling=SamplingParams(max_new_tokens=4, temperature=1.0),
        optimizer={"lr": lr},
        update={"micro_batch_size": 64, "epochs": ppo_epochs},
        advantage_estimator=estimator,
        policy_loss=loss,
    )
    rewards = []
    for step in range(NUM_STEPS):
        batch = prompts[step * PROMPTS_PER_STEP : (step + 1) * PROMPTS_PER_STEP]
        rewards.append(trainer.step(batch).metrics["reward_mean"])
    trainer.close()
    start, end = statistics.fmean(rewards[:5]), statistics.fmean(rewards[-10:])
    assert end - start >= 0.2, [round(r, 2) for r in rewards]
