"""Runs environments for many episodes at once, in process: the twin of the environment
service's client (both keep ``EnvironmentClient``).

Each episode has its own environment object, made from a class named by import path
(``module:Class`` or ``file.py:Class``) when the episode is reset and dropped when it is
closed or done. The runner knows nothing of tokens, engines or the schedule; it maps
episode ids to environments and keeps the number of live episodes bounded.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from hybridflow.config.import_path import load_callable
from hybridflow.envs.base import Environment, Message, StepResult, Task
from hybridflow.errors import Unavailable


class EpisodeError(RuntimeError):
    """The episode's environment raised, or the episode is unknown: that episode ends with
    this error; other episodes go on."""


class EnvironmentUnavailable(Unavailable):
    """The environment service cannot be reached, missed the call's deadline, or restarted
    and lost its episodes: the episodes in flight there are gone through no fault of their
    own, and restart from their task (under new episode ids). Never raised in process."""


class EnvironmentClient(Protocol):
    """What the multi-turn rollout loop drives: the in-process ``LocalEnvironments`` or the
    environment service's gRPC client."""

    def reset(self, episode_id: str, env: str, task: Task) -> tuple[Message, ...]:
        """Start episode ``episode_id`` in a fresh environment of class ``env`` (an import
        path) on ``task``; returns the opening messages. EpisodeError if the environment
        raised; ValueError for a bad ``env`` path or a duplicate live ``episode_id``;
        EnvironmentUnavailable (the service's client) when the service is gone."""
        ...

    def step(self, episode_id: str, action: str) -> StepResult:
        """The policy's turn (decoded text) to the episode's environment. EpisodeError if
        the environment raised or the episode is not live. A ``done`` result closes it.
        EnvironmentUnavailable (the service's client) when the service is gone."""
        ...

    def close(self, episode_id: str) -> None:
        """Drop the episode (no error if it is not live)."""
        ...


def load_environment_class(path: str) -> type[Any]:
    """The environment class named by ``path``; ValueError naming the path if it is bad."""
    cls = load_callable(path, "environment", (), "()")
    if not isinstance(cls, type):
        raise ValueError(f"environment path {path!r}: expected a class, got {cls!r}")
    for method in ("reset", "step"):
        if not callable(getattr(cls, method, None)):
            raise ValueError(f"environment path {path!r}: class has no {method}() method")
    return cls


class LocalEnvironments:
    """``EnvironmentClient`` in this process. Thread-safe: the rollout loop's threads may
    step different episodes at once (one episode is stepped by one thread at a time)."""

    def __init__(self, max_episodes: int = 1024) -> None:
        if max_episodes < 1:
            raise ValueError(f"max_episodes must be >= 1, got {max_episodes}")
        self.max_episodes = max_episodes
        self._classes: dict[str, type[Any]] = {}
        self._episodes: dict[str, Environment] = {}
        self._lock = threading.Lock()

    def reset(self, episode_id: str, env: str, task: Task) -> tuple[Message, ...]:
        with self._lock:
            cls = self._classes.get(env)
            if cls is None:
                cls = self._classes[env] = load_environment_class(env)
            if episode_id in self._episodes:
                raise ValueError(f"episode {episode_id!r} is already live")
            if len(self._episodes) >= self.max_episodes:
                raise ValueError(
                    f"{len(self._episodes)} episodes are live, the bound is "
                    f"{self.max_episodes}: close finished episodes first"
                )
        try:
            instance = cls()
            opening = tuple(instance.reset(task))
        except Exception as exc:  # user code: this episode fails, the caller goes on
            raise EpisodeError(
                f"episode {episode_id!r}: {env}.reset raised {type(exc).__name__}: {exc}"
            ) from exc
        with self._lock:
            self._episodes[episode_id] = instance
        return opening

    def step(self, episode_id: str, action: str) -> StepResult:
        with self._lock:
            instance = self._episodes.get(episode_id)
        if instance is None:
            raise EpisodeError(f"episode {episode_id!r} is not live (never reset, or closed)")
        try:
            result = instance.step(action)
        except Exception as exc:  # user code: this episode fails, the caller goes on
            self.close(episode_id)
            raise EpisodeError(
                f"episode {episode_id!r}: step raised {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(result, StepResult):
            self.close(episode_id)
            raise EpisodeError(
                f"episode {episode_id!r}: step returned {type(result).__name__}, "
                "expected StepResult"
            )
        if result.done:
            self.close(episode_id)
        return result

    def close(self, episode_id: str) -> None:
        with self._lock:
            self._episodes.pop(episode_id, None)

    @property
    def num_live(self) -> int:
        with self._lock:
            return len(self._episodes)
