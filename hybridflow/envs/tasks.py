"""Dataset rows <-> episode tasks, for the built-in environments' datasets.

A row is in verl's format (``prompt`` as chat messages, ``data_source``,
``reward_model.ground_truth``, ``extra_info``) and its ``prompt`` is exactly what the
environment's ``reset`` says for the row's task, so a single-turn loader and a multi-turn loop
see the same opening. ``extra_info["env"]`` names the environment class (import path) that
plays the row.

The task's ``prompt`` is the content of the row's last user message (the system message, if
any, is the environment's own and ``reset`` writes it again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hybridflow.envs.base import Environment, Message, Task

ENV_KEY = "env"
"""``extra_info`` key naming the environment class of a row (``module:Class``)."""


def task_row(task: Task, env: Environment, env_path: str) -> dict[str, Any]:
    """The verl row of ``task``: its prompt is ``env.reset(task)`` (``env`` is spent)."""
    opening = env.reset(task)
    return {
        "prompt": messages_to_dicts(opening),
        "data_source": task.data_source,
        "reward_model": {"ground_truth": task.ground_truth},
        "extra_info": {**task.extra_info, ENV_KEY: env_path},
    }


def task_from_row(row: dict[str, Any]) -> Task:
    """The task a row describes; ValueError naming the field if the row has none."""
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list):
        users = [
            m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"
        ]
        if not users or not isinstance(users[-1], str):
            raise ValueError(f"field 'prompt': no user message with string content in {prompt!r}")
        text = users[-1]
    else:
        raise ValueError(f"field 'prompt' must be a string or chat messages, got {prompt!r}")
    truth = (row.get("reward_model") or {}).get("ground_truth")
    return Task(
        prompt=text,
        ground_truth=None if truth is None else str(truth),
        data_source=str(row.get("data_source", "")),
        extra_info=dict(row.get("extra_info") or {}),
    )


def messages_to_dicts(messages: Sequence[Message]) -> list[dict[str, str]]:
    """Messages as the ``{role, content}`` dicts of datasets and chat templates."""
    return [{"role": m.role, "content": m.content} for m in messages]
