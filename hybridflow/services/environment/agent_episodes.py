"""Agent episodes of the environment service (``RunAgent``): the agent endpoint and the
agents that talk to it live here together, so an agent reaches its episode's endpoint on
loopback and a trajectory leaves the process only once, whole.

One run: the episode is opened on the ``AgentEndpoint`` with a ``generate`` bound to the
replica the coordinator named (the concurrent episodes' requests to one replica sent
together: ``agents.batching``); the allow-listed agent runs in a thread of this host with
the task and an OpenAI client on the episode's URL and key, for at most
``environment.agent_timeout_s`` (past it the episode ends with an error, its endpoint
closed, while the thread runs on holding its place); the episode is closed and what it
captured answered. An agent that raises or answers a bad reward ends its episode with the
error (trained as a failed sample, reward 0); a replica that failed a request is told apart
(``replica_error``): the episode is not the agent's failure, and the coordinator generates
it again. Bounded by ``environment.max_episodes`` agent episodes at once. No grpc, no proto.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

from hybridflow.agents.batching import CoalescingGenerate
from hybridflow.agents.endpoint import AgentEndpoint, EpisodeResult
from hybridflow.agents.runner import AgentOutcome, load_agent, run_agent
from hybridflow.arrays import TokenArray
from hybridflow.clients import RolloutClient
from hybridflow.envs.base import Task
from hybridflow.services.environment.config import EnvironmentConfig
from hybridflow.types import Completion, SamplingParams

log = logging.getLogger(__name__)
MAX_LOGGED_ERRORS = 100
"""Distinct episode errors logged (each once, the first time it is seen)."""


@dataclass
class AgentRun:
    """What one agent episode came to."""

    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    captured: EpisodeResult | None = None
    error: str = ""
    replica_error: str = ""


class AgentHost:
    """Runs agent episodes (module docstring); thread-safe."""

    def __init__(
        self,
        config: EnvironmentConfig,
        endpoint: AgentEndpoint,
        rollout_for: Callable[[str], RolloutClient],
    ) -> None:
        """``rollout_for(address)``: the client of the replica at ``address`` (made once)."""
        self.config = config
        self.allowed = tuple(config.envs)
        self.endpoint = endpoint
        self._rollout_for = rollout_for
        self._batchers: dict[str, CoalescingGenerate] = {}
        self._pool = futures.ThreadPoolExecutor(config.max_episodes, thread_name_prefix="agent")
        self._lock = threading.Lock()
        self._running = 0
        self._hung = 0
        self._logged: set[str] = set()

    def run(
        self, episode_id: str, agent: str, task: Task, replica_address: str, params: SamplingParams
    ) -> AgentRun:
        """One episode whole; ValueError for an agent not allow-listed, a bad path, a live
        id or the bound on live episodes (nothing ran)."""
        if agent not in self.allowed:
            raise ValueError(
                f"agent {agent!r} is not in environment.envs (allowed: {list(self.allowed)})"
            )
        fn = load_agent(agent)
        with self._lock:
            if self._running + self._hung >= self.config.max_episodes:
                raise ValueError(
                    f"{self._running + self._hung} agent episodes hold a place (running or hung), "
                    f"the bound is environment.max_episodes={self.config.max_episodes}"
                )
            self._running += 1
        try:
            return self._run(episode_id, fn, task, replica_address, params)
        finally:
            with self._lock:
                self._running -= 1

    def _run(
        self, episode_id: str, fn: Any, task: Task, replica_address: str, params: SamplingParams
    ) -> AgentRun:
        run = AgentRun()
        batched = self._batcher(replica_address)

        def generate(context: TokenArray, sampling: SamplingParams) -> Completion:
            try:
                completion = batched(context, sampling)
            except Exception as exc:
                run.replica_error = run.replica_error or f"replica {replica_address}: {exc}"
                raise
            return completion

        base_url, key = self.endpoint.open(episode_id, generate, params)
        timeout = self.config.agent_timeout_s
        future = self._pool.submit(run_agent, fn, task, base_url, key, timeout)
        try:
            outcome: AgentOutcome | None = future.result(timeout=timeout)
        except futures.TimeoutError:
            outcome = None
            run.error = f"the agent did not return within environment.agent_timeout_s={timeout:g}s"
            with self._lock:
                self._hung += 1
            future.add_done_callback(lambda _: self._release_hung())
        except Exception as exc:  # noqa: BLE001 — the agent's own failure: this episode's
            outcome = None
            run.error = f"the agent raised {type(exc).__name__}: {exc}"
            self._log_first(episode_id, run.error, exc)
        run.captured = self.endpoint.close(episode_id)
        if outcome is not None:
            run.reward, run.info = outcome.reward, outcome.info
            try:
                json.dumps(run.info)
            except (TypeError, ValueError) as exc:
                run.reward, run.info, run.error = 0.0, {}, f"the agent's info is not JSON: {exc}"
        if run.captured.error and not run.error:
            run.error = run.captured.error  # a refused request (a bound): the episode failed
        if run.error:
            run.reward = 0.0
        return run

    def _log_first(self, episode_id: str, error: str, exc: BaseException) -> None:
        """The first episode that fails with each distinct error, with its traceback."""
        with self._lock:
            if error in self._logged or len(self._logged) >= MAX_LOGGED_ERRORS:
                return
            self._logged.add(error)
        log.warning("agent episode %s failed: %s", episode_id, error, exc_info=exc)

    def _batcher(self, address: str) -> CoalescingGenerate:
        """The replica's generate, the concurrent episodes' requests sent together."""
        with self._lock:
            if address not in self._batchers:
                window = self.config.endpoint.batch_window_ms / 1000
                self._batchers[address] = CoalescingGenerate(
                    self._rollout_for(address), window, name=address
                )
            return self._batchers[address]

    def _release_hung(self) -> None:
        with self._lock:
            self._hung -= 1

    def shutdown(self) -> None:
        """Stops taking episodes; hung threads are not waited for (the process is ending)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
