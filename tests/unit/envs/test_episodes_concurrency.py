"""The environment's answers to one turn run at once (``multi_turn.env_concurrency``): an
environment whose step waits until ``k`` steps are inside it at once finishes only when the
loop runs ``k`` together; the bound holds (never more than ``env_concurrency`` at once), and
the trajectories are what one step at a time makes."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from hybridflow.coordinator.config import MultiTurnConfig
from hybridflow.coordinator.episodes import EpisodeRunner
from hybridflow.envs.base import Message, StepResult, Task
from hybridflow.envs.chat_tokens import ChatTokens
from hybridflow.envs.runner import LocalEnvironments
from hybridflow.models.builtin import ensure_builtin_model
from hybridflow.models.text_only import load_tokenizer
from hybridflow.types import SamplingParams

from .test_episodes import ScriptedEngine, record

ENV = f"{__name__}:MeetingEnv"
WAIT_S = 60.0


class _Meeting:
    """How many steps are inside at once; ``quorum`` of them must meet before any returns."""

    lock = threading.Lock()
    inside = 0
    most = 0
    quorum = 1
    met = threading.Event()


class MeetingEnv:
    def reset(self, task: Task) -> tuple[Message, ...]:
        return (Message("user", task.prompt),)

    def step(self, action: str) -> StepResult:
        with _Meeting.lock:
            _Meeting.inside += 1
            _Meeting.most = max(_Meeting.most, _Meeting.inside)
            if _Meeting.inside >= _Meeting.quorum:
                _Meeting.met.set()
        met = _Meeting.met.wait(WAIT_S)
        with _Meeting.lock:
            _Meeting.inside -= 1
        return StepResult(reward=float(met), done=True)


@pytest.fixture
def tokenizer(tmp_path):
    return load_tokenizer(ensure_builtin_model("tiny", root=Path(tmp_path)))


def run(tokenizer, quorum: int, concurrency: int, episodes: int):
    _Meeting.inside, _Meeting.most, _Meeting.quorum = 0, 0, quorum
    _Meeting.met = threading.Event()
    runner = EpisodeRunner(
        LocalEnvironments(),
        ChatTokens(tokenizer),
        MultiTurnConfig(env=ENV, env_concurrency=concurrency),
    )
    engine = ScriptedEngine(tokenizer, ["12"])
    return runner.run([record("a")], SamplingParams(n=episodes, max_new_tokens=4), engine, "q")


def test_a_turns_steps_run_together_up_to_the_bound(tokenizer):
    batch = run(tokenizer, quorum=4, concurrency=4, episodes=6)
    assert [r.score for r in batch.results[0]] == [1.0] * 6  # four met inside at once
    assert _Meeting.most == 4  # and never more than the bound


def test_one_at_a_time_makes_the_same_trajectories(tokenizer):
    together = run(tokenizer, quorum=1, concurrency=8, episodes=3)
    alone = run(tokenizer, quorum=1, concurrency=1, episodes=3)
    assert _Meeting.most == 1
    for a, b in zip(together.groups[0], alone.groups[0], strict=True):
        assert np.array_equal(a.token_ids, b.token_ids)
        assert np.array_equal(a.loss_mask, b.loss_mask)
    assert [r.score for r in together.results[0]] == [r.score for r in alone.results[0]]
