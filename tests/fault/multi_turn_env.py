"""A multi-turn environment for the fault tests, outside the package: ``builtin:arith`` tasks
with retries. A wrong answer gets "no, try again" and another turn (three in all); a right
one ends the episode with reward 1. Each step waits a little, so a run spends much of its
time inside episodes. A test that must kill mid-episode holds the steps: while the file
``$HYBRIDFLOW_TEST_HOLD_DIR/hold`` exists every step waits (up to a minute), having written
``held-<pid>`` there, so the kill lands while an episode is open, whatever the machine's speed
(``tests/fault/harness.py``, ``Trial.hold_dir``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hybridflow.envs.base import Message, StepResult, Task

STEP_DELAY_S = 0.02


class RetryArithEnv:
    def reset(self, task: Task) -> tuple[Message, ...]:
        self.truth, self.tries = (task.ground_truth or "").strip(), 0
        return (Message("user", task.prompt),)

    def step(self, action: str) -> StepResult:
        time.sleep(STEP_DELAY_S)
        _wait_while_held()
        self.tries += 1
        if action.strip() == self.truth:
            return StepResult(reward=1.0, done=True, info={"success": True})
        if self.tries >= 3:
            return StepResult(done=True)
        return StepResult(observation=(Message("user", "no, try again"),))


def _wait_while_held() -> None:
    folder = os.environ.get("HYBRIDFLOW_TEST_HOLD_DIR")
    if not folder or not (Path(folder) / "hold").exists():
        return
    (Path(folder) / f"held-{os.getpid()}").touch()
    deadline = time.monotonic() + 60
    while (Path(folder) / "hold").exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # another process's file: nothing to wait on here
