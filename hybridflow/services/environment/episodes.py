"""The environment service's core: ``LocalEnvironments`` behind the guards a service needs.

A Reset may only name an allow-listed class (``environment.envs``): an RPC never imports
code the job did not list. Each environment call (reset, step) runs in a thread of a pool
and is waited for at most ``environment.step_timeout_s``; one that takes longer ends its
episode with an ``EpisodeError`` while its thread runs on ("hung"), holding its episode's
place under ``environment.max_episodes`` until it returns, so hung user code cannot grow
the service's threads without bound. One episode takes one call at a time. Counters for
``GetInfo``. No grpc, no proto: the servicer converts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any, TypeVar, get_args

from hybridflow.envs.base import Message, Role, StepResult, Task
from hybridflow.envs.runner import EpisodeError, LocalEnvironments
from hybridflow.services.environment.config import EnvironmentConfig

T = TypeVar("T")
ROLES: tuple[str, ...] = get_args(Role)


@dataclass(frozen=True)
class EpisodeCounts:
    """What ``GetInfo`` reports of the episodes."""

    num_live: int
    num_started: int
    num_finished: int
    num_errored: int
    num_hung: int


class EpisodeHost:
    """Runs the episodes of the environment service (thread-safe)."""

    def __init__(self, config: EnvironmentConfig, max_concurrent_calls: int) -> None:
        """``max_concurrent_calls``: calls the server serves at once (its concurrency limit)."""
        self.config = config
        self.allowed = tuple(config.envs)
        self._envs = LocalEnvironments(config.max_episodes)
        # Threads in use: the calls being waited for (at most the server's concurrency limit)
        # plus the hung ones (each holds an episode's place): the pool never queues a call.
        self._pool = futures.ThreadPoolExecutor(
            max_workers=config.max_episodes + max_concurrent_calls,
            thread_name_prefix="environment",
        )
        self._lock = threading.Lock()
        self._busy: set[str] = set()
        """Episodes with a call being waited for."""
        self._hung: set[str] = set()
        """Episodes whose call outlived step_timeout_s and still runs."""
        self._resetting = 0
        self.num_started = 0
        self.num_finished = 0
        self.num_errored = 0

    def reset(self, episode_id: str, env: str, task: Task) -> tuple[Message, ...]:
        """The opening messages of a new episode; ValueError for a path not allow-listed, a
        duplicate episode or the bound reached; EpisodeError if the environment raised, hung
        or answered what the wire cannot carry (``_check_answer``)."""
        if env not in self.allowed:
            raise ValueError(
                f"env {env!r} is not in environment.envs (allowed: {list(self.allowed)})"
            )
        with self._lock:
            if episode_id in self._busy or episode_id in self._hung:
                raise ValueError(f"episode {episode_id!r} still has a call running")
            held = self._envs.num_live + len(self._hung) + self._resetting
            if held >= self.config.max_episodes:
                raise ValueError(
                    f"{held} episodes hold a place (live, starting or hung), the bound is "
                    f"environment.max_episodes={self.config.max_episodes}: close finished "
                    "episodes first"
                )
            self._resetting += 1
            self._busy.add(episode_id)
        try:
            opening = self._call(
                episode_id, "reset", lambda: self._envs.reset(episode_id, env, task)
            )
            self._check_answer(episode_id, opening)
        except EpisodeError:
            self._count("num_errored")
            raise
        finally:
            with self._lock:
                self._resetting -= 1
                self._busy.discard(episode_id)
        self._count("num_started")
        return opening

    def step(self, episode_id: str, action: str) -> StepResult:
        """The environment's answer to the policy's turn; EpisodeError (the episode ends) if
        it raised, hung or answered what the wire cannot carry, or the episode is not live
        or already has a call running."""
        with self._lock:
            busy = episode_id in self._busy or episode_id in self._hung
            if not busy:
                self._busy.add(episode_id)
        if busy:
            self._count("num_errored")
            raise EpisodeError(f"episode {episode_id!r} already has a call running")
        try:
            result = self._call(episode_id, "step", lambda: self._envs.step(episode_id, action))
            self._check_answer(episode_id, result.observation, result.info)
        except EpisodeError:
            self._count("num_errored")
            raise
        finally:
            with self._lock:
                self._busy.discard(episode_id)
        if result.done:
            self._count("num_finished")
        return result

    def close(self, episode_id: str) -> None:
        """Drops the episode (nothing if it is not live)."""
        self._envs.close(episode_id)

    def counts(self) -> EpisodeCounts:
        with self._lock:
            return EpisodeCounts(
                num_live=self._envs.num_live,
                num_started=self.num_started,
                num_finished=self.num_finished,
                num_errored=self.num_errored,
                num_hung=len(self._hung),
            )

    def shutdown(self) -> None:
        """Stops taking calls; hung threads are not waited for (the process is ending)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _call(self, episode_id: str, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` in a pool thread, waited for at most step_timeout_s; past it the episode
        is closed, marked hung until the thread returns, and EpisodeError raised."""
        future = self._pool.submit(fn)
        try:
            return future.result(timeout=self.config.step_timeout_s)
        except futures.TimeoutError:
            pass
        with self._lock:
            self._hung.add(episode_id)
        future.add_done_callback(lambda _: self._release_hung(episode_id))
        self._envs.close(episode_id)
        raise EpisodeError(
            f"episode {episode_id!r}: {what} did not return within "
            f"environment.step_timeout_s={self.config.step_timeout_s:g}s"
        )

    def _release_hung(self, episode_id: str) -> None:
        """A hung call returned: a late reset's episode is dropped, its place freed."""
        self._envs.close(episode_id)
        with self._lock:
            self._hung.discard(episode_id)

    def _check_answer(
        self, episode_id: str, messages: tuple[Message, ...], info: dict[str, Any] | None = None
    ) -> None:
        """EpisodeError (the episode closed) unless every message is a ``Message`` of a known
        role within max_message_chars and ``info`` is JSON: what the wire can carry."""
        bound = self.config.max_message_chars
        problem = None
        for i, message in enumerate(messages):
            if not isinstance(message, Message) or not isinstance(message.content, str):
                problem = f"message {i} is {message!r}, expected a Message with str content"
            elif message.role not in ROLES:
                problem = f"message {i} has role {message.role!r}, expected one of {ROLES}"
            elif len(message.content) > bound:
                problem = (
                    f"message {i} has {len(message.content)} characters, more than "
                    f"environment.max_message_chars={bound}"
                )
            if problem:
                break
        if problem is None and info:
            try:
                json.dumps(info)
            except (TypeError, ValueError) as exc:
                problem = f"info is not JSON: {exc}"
        if problem is not None:
            self._envs.close(episode_id)
            raise EpisodeError(f"episode {episode_id!r}: {problem}")

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)
