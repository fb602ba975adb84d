"""Proto ↔ domain conversions of the environment service."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast, get_args

from hybridflow.envs.base import Message, Role, StepResult, Task
from hybridflow.v1 import environment_pb2


def _json_object(text: str, field: str) -> dict[str, Any]:
    """The JSON object in ``text`` ({} when empty); ValueError naming ``field``."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{field} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be a JSON object, got {type(value).__name__}")
    return value


def task_to_proto(task: Task) -> environment_pb2.EpisodeTask:
    return environment_pb2.EpisodeTask(
        prompt=task.prompt,
        has_ground_truth=task.ground_truth is not None,
        ground_truth=task.ground_truth or "",
        data_source=task.data_source,
        extra_info_json=json.dumps(task.extra_info) if task.extra_info else "",
    )


def task_from_proto(msg: environment_pb2.EpisodeTask) -> Task:
    return Task(
        prompt=msg.prompt,
        ground_truth=msg.ground_truth if msg.has_ground_truth else None,
        data_source=msg.data_source,
        extra_info=_json_object(msg.extra_info_json, "task.extra_info_json"),
    )


def messages_to_proto(messages: Sequence[Message]) -> list[environment_pb2.ChatMessage]:
    return [environment_pb2.ChatMessage(role=m.role, content=m.content) for m in messages]


def messages_from_proto(msgs: Sequence[environment_pb2.ChatMessage]) -> tuple[Message, ...]:
    """ValueError naming the message whose role is not a chat role."""
    out = []
    for i, m in enumerate(msgs):
        if m.role not in get_args(Role):
            raise ValueError(f"messages[{i}].role: unknown role {m.role!r}")
        out.append(Message(role=cast(Role, m.role), content=m.content))
    return tuple(out)


def step_to_proto(result: StepResult, instance: str) -> environment_pb2.StepResponse:
    return environment_pb2.StepResponse(
        messages=messages_to_proto(result.observation),
        reward=result.reward,
        done=result.done,
        info_json=json.dumps(result.info) if result.info else "",
        instance=instance,
    )


def step_from_proto(msg: environment_pb2.StepResponse) -> StepResult:
    return StepResult(
        observation=messages_from_proto(msg.messages),
        reward=msg.reward,
        done=msg.done,
        info=_json_object(msg.info_json, "info_json"),
    )
