"""Proto ↔ domain conversions of the environment service."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast, get_args

import numpy as np

from hybridflow.envs.base import Message, Role, StepResult, Task
from hybridflow.types import Completion
from hybridflow.v1 import environment_pb2


def json_object(text: str, field: str) -> dict[str, Any]:
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
        extra_info=json_object(msg.extra_info_json, "task.extra_info_json"),
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
        info=json_object(msg.info_json, "info_json"),
    )


def trajectory_to_proto(c: Completion) -> environment_pb2.AgentTrajectory:
    assert c.prompt_ids is not None and c.loss_mask is not None and c.token_versions is not None
    return environment_pb2.AgentTrajectory(
        prompt_ids=np.ascontiguousarray(c.prompt_ids, "<i4").tobytes(),
        token_ids=np.ascontiguousarray(c.token_ids, "<i4").tobytes(),
        logprobs=np.ascontiguousarray(c.logprobs, "<f4").tobytes(),
        token_versions=np.ascontiguousarray(c.token_versions, "<i4").tobytes(),
        loss_mask=np.ascontiguousarray(c.loss_mask, np.uint8).tobytes(),
        finish_reason=c.finish_reason,
    )


def trajectory_from_proto(msg: environment_pb2.AgentTrajectory, where: str) -> Completion:
    """ValueError naming ``where`` when the arrays disagree in length or the finish is not
    stop or length."""
    ids = np.frombuffer(msg.token_ids, "<i4")
    arrays = {
        "logprobs": np.frombuffer(msg.logprobs, "<f4"),
        "token_versions": np.frombuffer(msg.token_versions, "<i4"),
        "loss_mask": np.frombuffer(msg.loss_mask, np.uint8),
    }
    bad = [name for name, a in arrays.items() if a.size != ids.size]
    if bad or msg.finish_reason not in ("stop", "length") or ids.size == 0:
        raise ValueError(f"{where}: a malformed trajectory ({bad or msg.finish_reason or 'empty'})")
    mask = arrays["loss_mask"]
    versions = arrays["token_versions"]
    return Completion(
        token_ids=ids,
        logprobs=arrays["logprobs"],
        finish_reason=cast(Any, msg.finish_reason),
        policy_version=int(versions[mask == 1].min()) if mask.any() else -1,
        token_versions=versions,
        loss_mask=mask,
        prompt_ids=np.frombuffer(msg.prompt_ids, "<i4"),
    )
