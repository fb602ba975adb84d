"""What ``builtin:tiny-tools`` is measured on: real episodes of the built-in environments,
played at temperature 1 through the coordinator's multi-turn loop (``EpisodeRunner`` with
``LocalEnvironments``) over an ``HFEngine``, with fixed seeds.

- ``calc_tool_rate``: episodes that call the calculator (the warm start leaves room to rise);
- ``calc_call_ok``: among those, episodes whose first call parses and whose expression
  evaluates to the task's answer;
- ``calc_copy_ok``: among episodes that got the right result from the tool, those that then
  answered it (the model copies a result it has);
- ``calc_success``: episodes answered right (reported, not gated: it follows from the three
  above);
- ``calc_no_tool_success``: episodes answered right with the tool switched off
  (``NoToolCalculatorEnv``): the model cannot do the arithmetic in its head;
- ``guess_success`` and ``guess_turns_per_success``: games won within the allowed guesses, and
  their mean length (binary search takes 5.8 on average, the quarter search 6.6).

The episodes are sampled, so on another CPU float noise may flip a rare sample and move a rate
by an episode or two (``TOLERANCE``). This module knows nothing about training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridflow.envs.base import Message, StepResult, Task
from hybridflow.envs.calculator import ENV_PATH as CALC_ENV
from hybridflow.envs.calculator import NO_TOOL_ENV_PATH, TOOL_NAME
from hybridflow.envs.guess_number import ENV_PATH as GUESS_ENV
from hybridflow.envs.runner import LocalEnvironments
from hybridflow.envs.safe_arith import CalcError, evaluate
from hybridflow.envs.tool_calls import parse_tool_calls

NUM_EPISODES = 96
"""Episodes per measure."""
EVAL_DATA_SEED = 0
"""Rows of ``builtin:calc`` / ``builtin:guess`` measured on: the RL datasets' default rows,
which the warm start never saw (its tasks come from another stream)."""
SAMPLING_SEED = 1234
"""Seed of the engine's sampler."""
TOLERANCE = 0.1
"""How far a measure taken on another CPU may be from the recorded one: a few episodes of
``NUM_EPISODES`` flipped by float noise move a rate by a few hundredths and the mean turns
per success by about a tenth."""
CALC_MAX_TURNS = 3
GUESS_MAX_TURNS = 10
MAX_NEW_TOKENS = 48
"""Tokens per turn: a tool call on the longest expression takes about 40."""


@dataclass
class _Episode:
    task: Task
    actions: list[str] = field(default_factory=list)
    results: list[StepResult] = field(default_factory=list)


class _Recording(LocalEnvironments):
    """``LocalEnvironments`` that keeps every episode's task, actions and answers."""

    def __init__(self) -> None:
        super().__init__()
        self.episodes: dict[str, _Episode] = {}

    def reset(self, episode_id: str, env: str, task: Task) -> tuple[Message, ...]:
        self.episodes[episode_id] = _Episode(task)
        return super().reset(episode_id, env, task)

    def step(self, episode_id: str, action: str) -> StepResult:
        result = super().step(episode_id, action)
        self.episodes[episode_id].actions.append(action)
        self.episodes[episode_id].results.append(result)
        return result


def tools_numbers(path: Path) -> dict[str, float]:
    """The measures of the module docstring for the checkpoint at ``path``."""
    import torch

    from hybridflow.services.rollout.engine import HFEngine

    with torch.random.fork_rng(devices=[]):
        engine = HFEngine(path, seed=SAMPLING_SEED)
        calc = _play(engine, "builtin:calc", CALC_ENV, CALC_MAX_TURNS)
        no_tool = _play(engine, "builtin:calc", NO_TOOL_ENV_PATH, CALC_MAX_TURNS)
        guess = _play(engine, "builtin:guess", GUESS_ENV, GUESS_MAX_TURNS)
    tool_using = [e for e in calc if any(_calls(a) for a in e.actions)]
    with_result = [e for e in calc if _got_result(e)]
    won = [e for e in guess if _success(e)]
    return {
        "calc_tool_rate": len(tool_using) / len(calc),
        "calc_call_ok": _rate([_first_call_ok(e) for e in tool_using]),
        "calc_copy_ok": _rate([_success(e) for e in with_result]),
        "calc_success": _rate([_success(e) for e in calc]),
        "calc_no_tool_success": _rate([_success(e) for e in no_tool]),
        "guess_success": len(won) / len(guess),
        "guess_turns_per_success": _rate([len(e.actions) for e in won]),
    }


def _play(engine: Any, data: str, env: str, max_turns: int) -> list[_Episode]:
    from hybridflow.coordinator.config import MultiTurnConfig
    from hybridflow.coordinator.episodes import EpisodeRunner
    from hybridflow.data.datasets import load_prompt_dataset
    from hybridflow.envs.chat_tokens import ChatTokens
    from hybridflow.types import SamplingParams

    records = load_prompt_dataset(data, engine.tokenizer, num=NUM_EPISODES, seed=EVAL_DATA_SEED)
    envs = _Recording()
    config = MultiTurnConfig(env=env, max_turns=max_turns, max_total_tokens=480)
    runner = EpisodeRunner(envs, ChatTokens(engine.tokenizer), config)
    params = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW_TOKENS, seed=SAMPLING_SEED)
    runner.run(records, params, lambda ids, p, _rid: engine.generate(ids, p), "quality")
    return list(envs.episodes.values())


def _calls(action: str) -> list[Any]:
    return parse_tool_calls(action).in_order()


def _first_call_ok(episode: _Episode) -> bool:
    first = next(calls for calls in map(_calls, episode.actions) if calls)[0]
    if getattr(first, "name", None) != TOOL_NAME:
        return False
    expression = first.arguments.get("expression")
    try:
        return (
            isinstance(expression, str) and str(evaluate(expression)) == episode.task.ground_truth
        )
    except CalcError:
        return False


def _got_result(episode: _Episode) -> bool:
    truth = episode.task.ground_truth
    return any(
        m.role == "tool" and m.content == truth for r in episode.results for m in r.observation
    )


def _success(episode: _Episode) -> bool:
    return any(bool(r.info.get("success")) for r in episode.results)


def _rate(values: list[bool] | list[int]) -> float:
    return sum(values) / len(values) if values else 0.0
