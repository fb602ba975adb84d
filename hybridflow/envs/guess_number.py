"""The guess-the-number environment (``hybridflow.envs.guess_number:GuessNumberEnv``), its
tasks (``builtin:guess``) and its demonstrations (binary search, and a slower search that
guesses a quarter of the way into the interval).

The secret is the task's ground truth, in ``[lo, hi]`` (``extra_info.lo`` / ``hi``, default
1..100). Each policy turn is one guess, ``<guess>N</guess>`` (the first such tag counts); the
environment answers with a user message: ``higher`` (the secret is larger), ``lower``, or, for
a turn without a readable guess or a guess outside the range, a short reminder; every turn
counts as a guess. A right guess ends the episode with reward
``1.0 + 0.5 * (max_guesses - guesses) / max_guesses`` (``guesses`` includes the right one), so
fewer guesses earn more; after ``max_guesses`` (``extra_info.max_guesses``, default 10) wrong
ones it ends with reward 0. ``info`` on every step: ``guesses`` (so far in the episode) and
``success`` (False until the right guess).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from hybridflow.envs.base import Message, StepResult, Task
from hybridflow.envs.tasks import task_row

ENV_PATH = "hybridflow.envs.guess_number:GuessNumberEnv"
DATA_SOURCE = "guess"
DEFAULT_LO = 1
DEFAULT_HI = 100
DEFAULT_MAX_GUESSES = 10
"""Binary search over 1..100 needs at most 7; three spare turns for format slips."""
HIGHER = "higher"
LOWER = "lower"
SPEED_BONUS = 0.5
"""Success reward on top of 1.0 for a first-guess hit, scaled by the guesses left."""

_GUESS = re.compile(r"<guess>\s*(-?\d{1,18})\s*</guess>")


def success_reward(guesses: int, max_guesses: int) -> float:
    """The reward of finding the secret on guess number ``guesses`` (1-based)."""
    return 1.0 + SPEED_BONUS * (max_guesses - guesses) / max_guesses


def guess_prompt(lo: int, hi: int) -> str:
    """The user's opening message for the range ``[lo, hi]``."""
    return f"Guess my number from {lo} to {hi}. Reply <guess>N</guess>; I say higher or lower."


def format_reminder(lo: int, hi: int) -> str:
    """The answer to a turn with no readable guess in range."""
    return f"Reply <guess>N</guess> with N from {lo} to {hi}."


class GuessNumberEnv:
    """One episode of a ``builtin:guess`` task (see the module docstring for the rules)."""

    def __init__(self) -> None:
        self.secret: int | None = None
        self.lo = DEFAULT_LO
        self.hi = DEFAULT_HI
        self.max_guesses = DEFAULT_MAX_GUESSES
        self.guesses = 0
        self.success = False

    def reset(self, task: Task) -> tuple[Message, ...]:
        self.lo = _int_field(task.extra_info, "lo", DEFAULT_LO)
        self.hi = _int_field(task.extra_info, "hi", DEFAULT_HI)
        self.max_guesses = _int_field(task.extra_info, "max_guesses", DEFAULT_MAX_GUESSES)
        if self.lo > self.hi:
            raise ValueError(f"task.extra_info: lo={self.lo} is above hi={self.hi}")
        if self.max_guesses < 1:
            raise ValueError(f"task.extra_info.max_guesses must be >= 1, got {self.max_guesses}")
        try:
            secret = int((task.ground_truth or "").strip())
        except ValueError:
            raise ValueError(
                f"task.ground_truth must be an integer secret, got {task.ground_truth!r}"
            ) from None
        if not self.lo <= secret <= self.hi:
            raise ValueError(f"task.ground_truth={secret} is outside [{self.lo}, {self.hi}]")
        self.secret = secret
        return (Message("user", task.prompt),)

    def step(self, action: str) -> StepResult:
        if self.secret is None:
            raise RuntimeError("step() before reset()")
        self.guesses += 1
        found = _GUESS.search(action)
        guess = int(found.group(1)) if found else None
        if guess == self.secret:
            self.success = True
            reward = success_reward(self.guesses, self.max_guesses)
            return StepResult(reward=reward, done=True, info=self._info())
        if self.guesses >= self.max_guesses:
            return StepResult(done=True, info=self._info())
        if guess is None or not self.lo <= guess <= self.hi:
            feedback = format_reminder(self.lo, self.hi)
        else:
            feedback = HIGHER if guess < self.secret else LOWER
        return StepResult(observation=(Message("user", feedback),), info=self._info())

    def _info(self) -> dict[str, Any]:
        return {"guesses": self.guesses, "success": self.success}


def _int_field(extra_info: dict[str, Any], key: str, default: int) -> int:
    value = extra_info.get(key, default)
    if type(value) is not int:
        raise ValueError(f"task.extra_info.{key} must be an integer, got {value!r}")
    return value


def guess_task(rng: random.Random, index: int = 0) -> Task:
    """One task over the default range, the secret drawn uniformly."""
    return Task(
        prompt=guess_prompt(DEFAULT_LO, DEFAULT_HI),
        ground_truth=str(rng.randint(DEFAULT_LO, DEFAULT_HI)),
        data_source=DATA_SOURCE,
        extra_info={
            "index": index,
            "lo": DEFAULT_LO,
            "hi": DEFAULT_HI,
            "max_guesses": DEFAULT_MAX_GUESSES,
        },
    )


def make_guess_rows(num: int, seed: int) -> list[dict[str, Any]]:
    """``num`` verl rows of guessing tasks, deterministic in (num, seed); a longer list with
    the same seed starts with the rows of a shorter one."""
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    rng = random.Random(f"hybridflow-guess:{seed}")
    return [task_row(guess_task(rng, i), GuessNumberEnv(), ENV_PATH) for i in range(num)]


def guess_demonstration(task: Task) -> list[Message]:
    """A successful episode by binary search (at most ceil(log2(hi - lo + 2)) guesses)."""
    return _search_demonstration(task, lambda lo, hi: (lo + hi) // 2)


def guess_quarter_demonstration(task: Task) -> list[Message]:
    """A successful episode by a valid but slower search: each guess a quarter of the way
    into the interval still possible. When that would need more than the task's
    ``max_guesses`` (7 secrets of 1..100), binary search's episode instead: over 1..100, 6.6
    guesses on average against binary search's 5.8. A warm start mixes both, so RL can lower the turns
    per success."""
    quarter = _search_demonstration(task, lambda lo, hi: lo + (hi - lo) // 4)
    max_guesses = _int_field(task.extra_info, "max_guesses", DEFAULT_MAX_GUESSES)
    if sum(m.role == "assistant" for m in quarter) <= max_guesses:
        return quarter
    return guess_demonstration(task)


def _search_demonstration(task: Task, pick: Callable[[int, int], int]) -> list[Message]:
    """The episode of guessing ``pick(lo, hi)`` in the interval still possible until right."""
    lo = _int_field(task.extra_info, "lo", DEFAULT_LO)
    hi = _int_field(task.extra_info, "hi", DEFAULT_HI)
    secret = int(task.ground_truth or "")
    if not lo <= secret <= hi:
        raise ValueError(f"task.ground_truth={secret} is outside [{lo}, {hi}]")
    conversation = [Message("user", task.prompt)]
    while True:
        guess = pick(lo, hi)
        conversation.append(Message("assistant", f"<guess>{guess}</guess>"))
        if guess == secret:
            return conversation
        if guess < secret:
            lo = guess + 1
            conversation.append(Message("user", HIGHER))
        else:
            hi = guess - 1
            conversation.append(Message("user", LOWER))
