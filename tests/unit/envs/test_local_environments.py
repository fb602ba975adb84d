"""LocalEnvironments: one environment object per episode, bounded, errors kept per episode."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hybridflow.envs.base import Message, StepResult, Task
from hybridflow.envs.runner import EpisodeError, LocalEnvironments, load_environment_class

HERE = f"{__name__}"


class Guess:
    """Guess the task's number; says higher/lower; done on the right answer."""

    instances = 0

    def __init__(self) -> None:
        Guess.instances += 1
        self.target = 0
        self.turns = 0

    def reset(self, task: Task) -> tuple[Message, ...]:
        self.target = int(task.ground_truth or 0)
        return (Message("user", task.prompt),)

    def step(self, action: str) -> StepResult:
        self.turns += 1
        guess = int(action)
        if guess == self.target:
            return StepResult(reward=1.0, done=True, info={"turns": self.turns})
        hint = "higher" if guess < self.target else "lower"
        return StepResult(observation=(Message("user", hint),))


class Broken:
    def reset(self, task: Task) -> tuple[Message, ...]:
        return (Message("user", task.prompt),)

    def step(self, action: str) -> StepResult:
        raise ZeroDivisionError("env bug")


class FailsReset:
    def reset(self, task: Task) -> tuple[Message, ...]:
        raise KeyError("no such task")

    def step(self, action: str) -> StepResult:
        return StepResult(done=True)


class WrongReturn:
    def reset(self, task: Task) -> tuple[Message, ...]:
        return ()

    def step(self, action: str) -> dict[str, object]:
        return {"done": True}


class NoStep:
    def reset(self, task: Task) -> tuple[Message, ...]:
        return ()


def make_guess() -> Guess:
    return Guess()


def _path(cls: type) -> str:
    return f"{HERE}:{cls.__name__}"


def test_each_episode_gets_its_own_environment() -> None:
    envs = LocalEnvironments()
    Guess.instances = 0
    opening = envs.reset("a", _path(Guess), Task("guess", ground_truth="3"))
    envs.reset("b", _path(Guess), Task("guess", ground_truth="7"))
    assert opening == (Message("user", "guess"),)
    assert Guess.instances == 2
    assert envs.step("a", "5").observation == (Message("user", "lower"),)
    assert envs.step("b", "5").observation == (Message("user", "higher"),)
    done = envs.step("a", "3")
    assert done.done and done.reward == 1.0 and done.info == {"turns": 2}
    assert envs.num_live == 1  # a done episode is closed
    with pytest.raises(EpisodeError, match="not live"):
        envs.step("a", "3")


def test_an_environment_that_raises_fails_only_its_episode() -> None:
    envs = LocalEnvironments()
    envs.reset("bad", _path(Broken), Task("x"))
    envs.reset("good", _path(Guess), Task("x", ground_truth="1"))
    with pytest.raises(EpisodeError, match="ZeroDivisionError: env bug"):
        envs.step("bad", "1")
    assert envs.num_live == 1
    assert envs.step("good", "1").done
    with pytest.raises(EpisodeError, match="reset raised KeyError"):
        envs.reset("r", _path(FailsReset), Task("x"))
    assert envs.num_live == 0


def test_a_step_that_returns_the_wrong_type_is_an_episode_error() -> None:
    envs = LocalEnvironments()
    envs.reset("w", _path(WrongReturn), Task("x"))
    with pytest.raises(EpisodeError, match="returned dict, expected StepResult"):
        envs.step("w", "1")
    assert envs.num_live == 0


def test_live_episodes_are_bounded_and_ids_unique() -> None:
    envs = LocalEnvironments(max_episodes=2)
    envs.reset("a", _path(Guess), Task("x", ground_truth="1"))
    with pytest.raises(ValueError, match="already live"):
        envs.reset("a", _path(Guess), Task("x", ground_truth="1"))
    envs.reset("b", _path(Guess), Task("x", ground_truth="1"))
    with pytest.raises(ValueError, match="the bound is 2"):
        envs.reset("c", _path(Guess), Task("x", ground_truth="1"))
    envs.close("a")
    envs.close("a")  # closing twice is fine
    envs.reset("c", _path(Guess), Task("x", ground_truth="1"))
    with pytest.raises(ValueError, match="max_episodes"):
        LocalEnvironments(max_episodes=0)


def test_bad_class_paths_are_refused_naming_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no_such_module"):
        load_environment_class("no_such_module:Env")
    with pytest.raises(ValueError, match="expected a class"):
        load_environment_class(f"{HERE}:make_guess")
    with pytest.raises(ValueError, match="no step"):
        load_environment_class(_path(NoStep))
    user = tmp_path / "my_env.py"
    user.write_text(
        "from hybridflow.envs.base import Message, StepResult\n"
        "class Echo:\n"
        "    def reset(self, task):\n"
        "        return (Message('user', task.prompt),)\n"
        "    def step(self, action):\n"
        "        return StepResult(observation=(Message('tool', action),), done=action == 'bye')\n"
    )
    envs = LocalEnvironments()
    envs.reset("e", f"{user}:Echo", Task("hi"))
    assert envs.step("e", "ping").observation == (Message("tool", "ping"),)
    assert envs.step("e", "bye").done


def test_threads_step_different_episodes_at_once() -> None:
    envs = LocalEnvironments()
    ids = [f"ep{i}" for i in range(16)]
    for i, eid in enumerate(ids):
        envs.reset(eid, _path(Guess), Task("x", ground_truth=str(i)))
    results: dict[str, StepResult] = {}
    barrier = threading.Barrier(len(ids))

    def play(i: int, eid: str) -> None:
        barrier.wait()
        results[eid] = envs.step(eid, str(i))

    threads = [threading.Thread(target=play, args=(i, e)) for i, e in enumerate(ids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[e].done for e in ids)
    assert envs.num_live == 0
