"""GuessNumberEnv: higher/lower, the success reward falls with the guesses, unreadable and
out-of-range guesses count as turns, the episode ends after max_guesses."""

from __future__ import annotations

import pytest

from hybridflow.envs.base import Environment, Message, StepResult, Task
from hybridflow.envs.guess_number import (
    GuessNumberEnv,
    format_reminder,
    guess_demonstration,
    guess_prompt,
    guess_quarter_demonstration,
    success_reward,
)


def started(secret: int = 37, lo: int = 1, hi: int = 100, max_guesses: int = 10) -> GuessNumberEnv:
    env = GuessNumberEnv()
    task = Task(
        guess_prompt(lo, hi),
        ground_truth=str(secret),
        extra_info={"lo": lo, "hi": hi, "max_guesses": max_guesses},
    )
    assert env.reset(task) == (Message("user", guess_prompt(lo, hi)),)
    return env


def test_it_is_an_environment() -> None:
    assert isinstance(GuessNumberEnv(), Environment)


def test_higher_and_lower_then_success() -> None:
    env = started(secret=37)
    assert env.step("<guess>50</guess>") == StepResult(
        observation=(Message("user", "lower"),), info={"guesses": 1, "success": False}
    )
    assert env.step("I'll try <guess> 25 </guess>").observation == (Message("user", "higher"),)
    final = env.step("<guess>37</guess>")
    assert final == StepResult(
        reward=success_reward(3, 10), done=True, info={"guesses": 3, "success": True}
    )
    assert final.reward == pytest.approx(1.0 + 0.5 * 7 / 10)


def test_fewer_guesses_earn_more() -> None:
    rewards = []
    for wrong in range(4):
        env = started(secret=37)
        for _ in range(wrong):
            env.step("<guess>1</guess>")
        rewards.append(env.step("<guess>37</guess>").reward)
    assert rewards == sorted(rewards, reverse=True) and len(set(rewards)) == 4
    assert all(r > 1.0 for r in rewards)


@pytest.mark.parametrize(
    "turn", ["fifty", "<guess>x</guess>", "<guess>0</guess>", "<guess>101</guess>"]
)
def test_an_unreadable_or_out_of_range_guess_gets_a_reminder_and_counts(turn: str) -> None:
    env = started(secret=37)
    result = env.step(turn)
    assert result == StepResult(
        observation=(Message("user", format_reminder(1, 100)),),
        info={"guesses": 1, "success": False},
    )
    assert env.step("<guess>37</guess>").reward == success_reward(2, 10)


def test_the_first_guess_tag_counts() -> None:
    assert started(secret=37).step("<guess>37</guess> or <guess>38</guess>").done


def test_out_of_guesses_ends_without_reward() -> None:
    env = started(secret=37, max_guesses=3)
    env.step("<guess>1</guess>")
    env.step("<guess>2</guess>")
    last = env.step("<guess>3</guess>")
    assert last == StepResult(done=True, info={"guesses": 3, "success": False})


def test_a_first_guess_hit_on_a_one_number_range() -> None:
    env = started(secret=5, lo=5, hi=5, max_guesses=1)
    assert env.step("<guess>5</guess>").reward == 1.0


@pytest.mark.parametrize(
    ("truth", "extra", "says"),
    [
        (None, {}, "task.ground_truth must be an integer secret"),
        ("abc", {}, "task.ground_truth must be an integer secret"),
        ("101", {}, r"task.ground_truth=101 is outside \[1, 100\]"),
        ("5", {"lo": 10, "hi": 1}, "lo=10 is above hi=1"),
        ("5", {"lo": "1"}, "task.extra_info.lo must be an integer, got '1'"),
        ("5", {"max_guesses": 0}, "max_guesses must be >= 1"),
    ],
)
def test_reset_refuses_a_bad_task(truth: str | None, extra: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        GuessNumberEnv().reset(Task("guess", ground_truth=truth, extra_info=extra))


def test_the_quarter_search_wins_every_game_in_more_guesses_than_binary_search() -> None:
    binary, quarter = [], []
    for secret in range(1, 101):
        task = Task(guess_prompt(1, 100), ground_truth=str(secret), extra_info={"max_guesses": 10})
        for demo, lengths in (
            (guess_demonstration, binary),
            (guess_quarter_demonstration, quarter),
        ):
            env = GuessNumberEnv()
            env.reset(task)
            turns = [m.content for m in demo(task) if m.role == "assistant"]
            results = [env.step(turn) for turn in turns]
            assert results[-1].done and results[-1].info["success"], (demo, secret)
            lengths.append(len(turns))
    assert max(quarter) <= 10 and sum(quarter) / 100 > sum(binary) / 100 + 0.8
