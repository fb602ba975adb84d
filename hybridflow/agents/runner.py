"""Agents as environments: any Python callable that takes a task and an OpenAI client pointed
at its episode's endpoint, runs its own loop and returns a reward.

    def my_agent(task: Task, client: openai.OpenAI) -> float | dict: ...
    async def my_agent(task: Task, client: openai.AsyncOpenAI) -> float | dict: ...

A ``dict`` answer holds ``reward`` and anything else JSON (kept in the episode's record as
its ``info``: ``success``, ``tool_calls``... as an environment's ``StepResult.info``). The
client is the real ``openai`` package's, with the episode's base URL and key, no retries (a
refused request is the agent's to see) and the episode's remaining time as its timeout.
This module knows nothing of the endpoint, tokens or services.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybridflow.config.import_path import load_callable
from hybridflow.envs.base import Task
from hybridflow.types import Completion

Agent = Callable[[Task, Any], Any]


@dataclass(frozen=True)
class AgentOutcome:
    """What an agent returned: its reward and the rest of its answer (``info``)."""

    reward: float
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class AgentEpisode:
    """One agent episode as the environment service answers it (``RunAgent``)."""

    reward: float
    info: dict[str, Any]
    trajectories: list[Completion]
    """Its segments' token-exact trajectories, in order."""
    num_requests: int
    breaks: dict[str, int]
    """Segment breaks by the check that failed."""
    error: str = ""
    """Why the episode failed (the agent raised or hung, a bound); empty when it did not."""
    replica_error: str = ""
    """Non-empty when the replica failed a request: the episode is to be generated again."""


def load_agent(path: str) -> Agent:
    """The agent callable at ``path`` ("module:function" or "file.py:function"); ValueError
    naming the path if it is not a callable of (task, client)."""
    fn = load_callable(path, "agent", (Task(""), None), "(task, client)")
    if inspect.isclass(fn):
        raise ValueError(f"agent path {path!r}: expected a function of (task, client), got a class")
    return fn  # type: ignore[no-any-return]


def run_agent(
    agent: Agent, task: Task, base_url: str, api_key: str, timeout_s: float
) -> AgentOutcome:
    """Runs ``agent`` on ``task`` against its endpoint; its outcome. Raises what the agent
    raised, or ValueError for an answer that is not a finite reward."""
    import openai

    if inspect.iscoroutinefunction(agent):
        client: Any = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s
        )
        answer = asyncio.run(_close_after(agent(task, client), client))
    else:
        # One HTTP client for every episode of the process (making one costs ~30 ms of CPU:
        # its TLS context), each episode's own base URL and key on top.
        client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key,
            max_retries=0,
            timeout=timeout_s,
            http_client=_shared_http(),
        )
        answer = agent(task, client)
    return outcome(answer)


_http_lock = threading.Lock()
_http: Any = None


def _shared_http() -> Any:
    global _http
    with _http_lock:
        if _http is None:
            import httpx

            limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
            _http = httpx.Client(limits=limits)
        return _http


async def _close_after(work: Any, client: Any) -> Any:
    try:
        return await work
    finally:
        await client.close()


def outcome(answer: Any) -> AgentOutcome:
    """An agent's answer as an outcome; ValueError naming what is wrong with it."""
    info: dict[str, Any] = {}
    if isinstance(answer, dict):
        info = {k: v for k, v in answer.items() if k != "reward"}
        answer = answer.get("reward")
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        raise ValueError(
            f"the agent returned {answer!r}: a float reward (or a dict with one) is required"
        )
    reward = float(answer)
    if not math.isfinite(reward):
        raise ValueError(f"the agent returned the reward {reward}: it must be finite")
    return AgentOutcome(reward, info)
