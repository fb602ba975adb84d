"""A multi-turn environment for the fault tests, outside the package: ``builtin:arith`` tasks
with retries. A wrong answer gets "no, try again" and another turn (three in all); a right
one ends the episode with reward 1. Each step waits a little, so a run spends much of its
time inside episodes and a kill lands mid-episode."""

from __future__ import annotations

import time

from hybridflow.envs.base import Message, StepResult, Task

STEP_DELAY_S = 0.02


class RetryArithEnv:
    def reset(self, task: Task) -> tuple[Message, ...]:
        self.truth, self.tries = (task.ground_truth or "").strip(), 0
        return (Message("user", task.prompt),)

    def step(self, action: str) -> StepResult:
        time.sleep(STEP_DELAY_S)
        self.tries += 1
        if action.strip() == self.truth:
            return StepResult(reward=1.0, done=True, info={"success": True})
        if self.tries >= 3:
            return StepResult(done=True)
        return StepResult(observation=(Message("user", "no, try again"),))
