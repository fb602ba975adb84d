"""``RLTrainer(env=...)``: multi-turn episodes in one process, with GRPO, PPO and DAPO's
dynamic sampling; ReMax is refused for episodes with an error naming it."""

from __future__ import annotations

import pytest

from hybridflow import RLTrainer
from hybridflow.envs.base import Message, StepResult, Task

ENV = f"{__name__}:ParityEnv"


class ParityEnv:
    """Two turns; the reward is 1 when the second answer has an even number of characters,
    so a group's rewards differ (dynamic sampling keeps some groups)."""

    def reset(self, task: Task) -> tuple[Message, ...]:
        self.turn = 0
        return (Message("user", task.prompt),)

    def step(self, action: str) -> StepResult:
        self.turn += 1
        if self.turn == 2:
            return StepResult(reward=float(len(action) % 2 == 0), done=True)
        return StepResult(observation=(Message("user", "and?"),), info={"tool_calls": 1})


@pytest.mark.parametrize(
    ("algo", "dynamic"), [("grpo", False), ("ppo", False), ("grpo", True)],
    ids=["grpo", "ppo", "grpo-dynamic-sampling"],
)  # fmt: skip
def test_trainer_runs_episodes(tiny_model_path, algo: str, dynamic: bool) -> None:  # type: ignore[no-untyped-def]
    trainer = RLTrainer(
        actor=tiny_model_path, reward_fn=lambda p, r: 0.0, algo=algo, env=ENV, max_turns=3,
        dynamic_sampling=dynamic, group_size=4, optimizer={"lr": 1e-3},
    )  # fmt: skip
    try:
        m = trainer.step(prompts=["1+2=", "3+4=", "5+5=", "7+1="]).metrics
    finally:
        trainer.close()
    assert m["episode/turns/mean"] == 2.0 and m["episode/finish/done"] == 1.0
    assert m["episode/tool_calls/mean"] == 1.0
    assert 0.0 < m["episode/policy_token_frac"] < 1.0
    assert m["reward_mean"] == m["critic/score/mean"]
    assert m["actor/grad_norm"] > 0
    if dynamic:  # the filter saw the episodes' scores; what it kept has unequal rewards
        assert "dynamic_sampling/filtered_total" in m
        if m["dynamic_sampling/passed_equal"] == 0:  # the safety valve did not let one through
            assert m["batch/solve_all"] == 0.0 and m["batch/solve_none"] == 0.0


def test_remax_is_refused_for_episodes(tiny_model_path) -> None:  # type: ignore[no-untyped-def]
    trainer = RLTrainer(
        actor=tiny_model_path, reward_fn=lambda p, r: 0.0, env=ENV, advantage_estimator="remax"
    )
    try:
        with pytest.raises(ValueError, match="ReMax"):
            trainer.step(prompts=["1+2="])
    finally:
        trainer.close()
