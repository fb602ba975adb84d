"""The environment contract of a multi-turn episode.

An episode alternates: the policy acts (one generated turn, as text), the environment answers
(messages for the chat template), until the environment says ``done`` or the rollout loop
stops it (``max_turns``, ``max_total_tokens``). An environment sees text only: it never sees
token ids, and the loop that drives it tokenises each observation exactly once, with the chat
template, so the ids the learner trains on are the ids the engine generated plus the
observation ids (token fidelity).

One environment object serves one episode: the runner (in process, or the environment
service) makes a fresh instance per episode from a class named by import path
(``module:Class``), calls ``reset`` once and ``step`` per policy turn. An exception from
either ends that episode with an error, never the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class Message:
    """One chat message, as the chat template renders it."""

    role: Role
    content: str


@dataclass(frozen=True)
class Task:
    """What an episode starts from: one dataset row (the prompt text, its ground truth and
    whatever else the row carries)."""

    prompt: str
    ground_truth: str | None = None
    data_source: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    """The environment's answer to one policy turn."""

    observation: tuple[Message, ...] = ()
    """Messages appended to the conversation before the policy's next turn (a tool result
    in the ``tool`` role, feedback in the ``user`` role); empty when ``done``."""
    reward: float = 0.0
    """This turn's reward (per-turn shaping); the episode's outcome reward is the sum over
    turns unless the environment puts it all on the last step."""
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    """Counters for metrics: ``tool_calls`` (int), ``tool_errors`` (int), ``success``
    (bool); anything else is kept in the episode's record."""


@runtime_checkable
class Environment(Protocol):
    """One episode's environment. ``reset`` gives the opening messages (the task as the
    user's first turn, and a system message listing tools, if any); ``step`` takes the
    policy's turn as decoded text (special tokens stripped) and answers it."""

    def reset(self, task: Task) -> tuple[Message, ...]: ...

    def step(self, action: str) -> StepResult: ...
