"""``verifiers`` (v1) tasks played through the episode's OpenAI endpoint and scored by the
task's own rewards: the agent ``hybridflow.agents.verifiers_env:verifiers_agent`` for rows of
a ``verifiers:<module:Taskset>`` dataset (``hybridflow.data.verifiers_tasks``).

One episode, as verifiers' chat harness plays it: the task's system prompt and prompt go to
the policy with the tools of the taskset's and the task's ``vf.Toolset``s; each tool call the
policy makes is run and its result sent back as a ``tool`` message; the episode ends at a
reply without tool calls, at a ``@vf.stop`` hook that says so, or after ``MAX_TURNS``
requests. The conversation becomes a ``vf.Trace`` and ``Task.score`` runs the task's
``@vf.reward``s and ``@vf.metric``s on it: the episode's reward is ``trace.reward`` (their
weighted sum), and each reward and metric is kept in its info.

What differs from verifiers' own runner, and why: the tools are served in this process by
the same MCP server class verifiers uses (``mcp``'s ``MCPServer``, in memory: no subprocess,
no port), made afresh for each episode (each episode runs on its own event loop; a toolset's
``setup`` runs per episode); the harness is this loop, not a program in a runtime (verifiers'
runtimes fetch their programs with ``uv`` and prime's sandboxes, which a job here cannot
reach). A reward that needs a runtime (``runtime`` without a default) is not run; the task's
other rewards are. A multi-agent ``vf.Env`` or a scripted user (``interaction``) is not
played.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from hybridflow.config.import_path import load_callable
from hybridflow.data.verifiers_tasks import EXTRA_KEY, opening_messages
from hybridflow.envs.base import Task

AGENT_PATH = "hybridflow.agents.verifiers_env:verifiers_agent"
MAX_TURNS = 8
"""Requests one episode may make (the endpoint's ``max_requests`` bounds it too)."""


async def verifiers_agent(task: Task, client: Any) -> dict[str, Any]:
    """One episode of the row's verifiers task (module docstring); its reward and info."""
    import verifiers.v1 as vf

    vtask, taskset_cls, taskset_config = rebuild_task(task)
    toolbox = await _Toolbox.open(
        [*taskset_cls.toolsets(taskset_config), *vtask.toolsets(vtask.config)], vtask
    )
    trace = vf.Trace(
        task=vf.TraceTask(type=type(vtask).__name__, data=vtask.data, key=vtask.key),
        agent=vf.AgentInfo(config=vf.AgentConfig(model="policy")),
    )
    messages = opening_messages(vtask.data)
    for message in messages:
        _append(trace, message, sampled=False)
    stops = vtask.hooks("stop")
    tool_calls = tool_errors = 0
    for _ in range(MAX_TURNS):
        kwargs = {"tools": toolbox.schemas} if toolbox.schemas else {}
        reply = await client.chat.completions.create(model="policy", messages=messages, **kwargs)
        said = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(said)
        _append(trace, said, sampled=True)
        if not said.get("tool_calls") or await _stopped(stops, trace):
            break
        for call in said["tool_calls"]:
            tool_calls += 1
            result, failed = await toolbox.call(call["function"])
            tool_errors += failed
            answer = {"role": "tool", "tool_call_id": call["id"], "content": result}
            messages.append(answer)
            _append(trace, answer, sampled=False)
    trace.is_completed = trace.ok = True
    await vtask.score(trace)
    return {
        "reward": trace.reward,
        "rewards": {k: r.score for k, r in trace.rewards.items() if r is not None},
        "metrics": {k: v for k, v in trace.metrics.items() if v is not None},
        "tool_calls": tool_calls,
        "tool_errors": tool_errors,
    }


def rebuild_task(task: Task) -> tuple[Any, Any, Any]:
    """(verifiers task, its taskset class, the taskset's config) from the row's
    ``extra_info.verifiers``; ValueError naming what is missing."""
    from verifiers.v1 import Taskset, TasksetConfig
    from verifiers.v1.utils.generic import concrete_type

    saved = task.extra_info.get(EXTRA_KEY)
    if not isinstance(saved, dict) or not {"task_type", "taskset", "data"} <= saved.keys():
        raise ValueError(
            f"verifiers_agent plays rows of a verifiers: dataset; this row's extra_info has "
            f"no {EXTRA_KEY!r} task (data_source {task.data_source!r})"
        )
    task_cls = _load_class(saved["task_type"])
    taskset_cls = _load_class(saved["taskset"])
    config_type = concrete_type(taskset_cls, TasksetConfig, origin=Taskset) or TasksetConfig
    taskset_config = config_type.model_validate(saved.get("taskset_config", {}))
    data = task_cls.data_type().model_validate(saved["data"])
    config = task_cls.config_type().model_validate(saved.get("config", {}))
    return task_cls(data, config), taskset_cls, taskset_config


def _load_class(path: str) -> Any:
    return load_callable(path, "verifiers class", [None], "(data or config)")


@functools.cache
def _message_adapter() -> Any:
    """verifiers' ``Message`` union's validator (built once: a TypeAdapter is costly)."""
    from pydantic import TypeAdapter
    from verifiers.v1.types import Message

    return TypeAdapter(Message)


def _append(trace: Any, message: dict[str, Any], sampled: bool) -> None:
    from verifiers.v1.graph import MessageNode

    if message.get("tool_calls"):  # OpenAI's nested function -> verifiers' flat ToolCall
        message = {
            **message,
            "tool_calls": [
                {
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "arguments": c["function"]["arguments"],
                }
                for c in message["tool_calls"]
            ],
        }
    parent = len(trace.nodes) - 1 if trace.nodes else None
    node = MessageNode(
        parent=parent,
        message=_message_adapter().validate_python(_known_fields(message)),
        sampled=sampled,
    )
    trace.nodes.append(node)


def _known_fields(message: dict[str, Any]) -> dict[str, Any]:
    keep = {"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content"}
    return {k: v for k, v in message.items() if k in keep}


async def _stopped(stops: list[Callable[..., Any]], trace: Any) -> bool:
    for stop in stops:
        said = stop(trace)
        if hasattr(said, "__await__"):
            said = await said
        if said:
            return True
    return False


class _Toolbox:
    """The episode's tools, served by in-memory MCP servers: their OpenAI schemas (named as
    verifiers' chat harness names them: ``<server>_<tool>``, or bare for a toolset whose
    ``TOOL_PREFIX`` is None) and the calls."""

    def __init__(self) -> None:
        self.schemas: list[dict[str, Any]] = []
        self._dispatch: dict[str, tuple[Any, str]] = {}

    @classmethod
    async def open(cls, toolsets: list[Any], vtask: Any) -> _Toolbox:
        from mcp.server.mcpserver import MCPServer

        box = cls()
        for toolset in toolsets:
            server = MCPServer(toolset.server_name or type(toolset).__name__)
            toolset.register(server)
            await toolset.setup()
            await toolset.setup_task(vtask)
            prefix = toolset.server_name
            for tool in await server.list_tools():
                full = f"{prefix}_{tool.name}" if prefix else tool.name
                if full in box._dispatch:
                    raise ValueError(f"two toolsets name the tool {full!r}")
                box._dispatch[full] = (server, tool.name)
                box.schemas.append(
                    {
                        "type": "function",
                        "function": {
                            "name": full,
                            "description": tool.description or "",
                            "parameters": tool.input_schema,
                        },
                    }
                )
        return box

    async def call(self, function: dict[str, Any]) -> tuple[str, bool]:
        """(the tool message's content, whether the call failed) of a tool call's
        ``function`` (name, arguments). A bad call is the policy's: it is answered with the
        error, not raised."""
        name = function.get("name", "")
        if name not in self._dispatch:
            return f"error: no tool {name!r} (tools: {sorted(self._dispatch)})", True
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError as exc:
            return f"error: the arguments are not JSON: {exc}", True
        if not isinstance(arguments, dict):
            return "error: the arguments must be a JSON object", True
        server, raw = self._dispatch[name]
        try:
            result = await server.call_tool(raw, arguments)
        except Exception as exc:  # a tool's failure is answered, as verifiers' harness does
            return f"error: {type(exc).__name__}: {exc}", True
        texts = [getattr(block, "text", str(block)) for block in getattr(result, "content", [])]
        return "\n".join(texts), bool(getattr(result, "is_error", False))
