"""What a replica's status says of its engine's progress (``engine_steps``,
``num_active_requests``; read by the coordinator's stall rule, ``coordinator/liveness.py``):
counted by ``LocalRollout`` at every decode step (the engine's stop-flag polls), at a
request's start and end and around weight applies, with a fake engine whose steps the test
drives one at a time."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from hybridflow.services.rollout.local import LocalRollout
from hybridflow.types import Completion, SamplingParams


class SteppedEngine:
    """Generates one token per ``step`` the test allows; polls ``should_stop`` before each."""

    def __init__(self, num_steps: int) -> None:
        self.num_steps = num_steps
        self.allowed = threading.Semaphore(0)
        self.polled = threading.Semaphore(0)
        self.policy_version = 0
        self.eos_token_id = 0
        self.vocab_size = 16
        self.tensor_parallel_size = 1
        self.between_steps = None
        self.applied: list[int] = []

    def generate(self, prompts: Any, params: SamplingParams, should_stop: Any = None) -> Any:
        for _ in range(self.num_steps):
            assert should_stop is not None and not should_stop()
            self.polled.release()
            assert self.allowed.acquire(timeout=30)
        tokens = np.ones(self.num_steps, dtype=np.int32)
        logprobs = np.zeros(self.num_steps, dtype=np.float32)
        return [[Completion(tokens, logprobs, "length", self.policy_version)] for _ in prompts]

    def load_weights(self, named_tensors: Any, policy_version: int) -> None:
        self.applied.append(policy_version)
        self.policy_version = policy_version

    def check_weights(self, named_tensors: Any) -> None:
        return None

    dead_reason = None

    def on_dead(self, callback: Any) -> None:
        return None

    def close(self) -> None:
        return None


def _steps(rollout: LocalRollout) -> tuple[int, int]:
    status = rollout.status()
    return status.engine_steps, status.num_active_requests


def test_every_decode_step_moves_the_count_and_the_request_is_held_meanwhile() -> None:
    engine = SteppedEngine(num_steps=3)
    rollout = LocalRollout(engine, "fake")  # type: ignore[arg-type]
    assert _steps(rollout) == (0, 0)
    params = SamplingParams(n=1, max_new_tokens=3)
    call = threading.Thread(target=rollout.generate, args=([[1, 2]], params))
    call.start()
    seen = []
    for _ in range(3):
        assert engine.polled.acquire(timeout=30)  # the engine is between two steps
        seen.append(_steps(rollout))
        engine.allowed.release()
    call.join(30)
    # Entering the engine counts 1, each poll 1; leaving it 1 more.
    assert seen == [(2, 1), (3, 1), (4, 1)]
    assert _steps(rollout) == (5, 0)


def test_an_engine_that_stops_stepping_stops_the_count() -> None:
    engine = SteppedEngine(num_steps=2)
    rollout = LocalRollout(engine, "fake")  # type: ignore[arg-type]
    call = threading.Thread(target=rollout.generate, args=([[1]], SamplingParams(n=1)))
    call.start()
    assert engine.polled.acquire(timeout=30)
    wedged = _steps(rollout)  # the engine does not step on: nothing released
    assert [_steps(rollout) for _ in range(5)] == [wedged] * 5 and wedged[1] == 1
    engine.allowed.release(2)
    call.join(30)


def test_a_weight_apply_moves_the_count() -> None:
    engine = SteppedEngine(num_steps=1)
    rollout = LocalRollout(engine, "fake")  # type: ignore[arg-type]
    rollout.load_weights([], 1)  # idle: applied at once
    assert engine.applied == [1] and _steps(rollout) == (2, 0)  # staged-and-taken, applied
