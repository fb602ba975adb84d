"""A ``verifiers`` (v1) taskset as a prompt dataset: ``verifiers:<module:Taskset>``, with the
taskset config's fields after a ``?`` (``verifiers:my_env.taskset:MyTaskset?num_tasks=64``;
each value read as YAML, a dotted key sets a nested field: ``task.tolerance=0.5``).

The rows are the taskset's first tasks, in its ``load()`` order (at most the trainer's
``data_size``, an eval set's ``size``; an infinite taskset is cut there). Each row's prompt is
the task's system prompt and prompt as chat messages; its ``data_source`` is ``verifiers``; its
``extra_info.verifiers`` holds what rebuilds the task in another process: the task's and the
taskset's classes, and the task's data and config and the taskset's config as JSON. Such rows are played by ``hybridflow.agents.verifiers_env``
(``coordinator.multi_turn.agent``), which scores each episode with the task's own rewards;
no reward-service scorer reads them.

A taskset that cannot be imported, is not a ``verifiers.v1.Taskset``, refuses the options or
yields no task is a ValueError naming the spec, raised before any row is used.
"""

from __future__ import annotations

import itertools
from typing import Any

from hybridflow.config.import_path import load_callable
from hybridflow.data.spec_options import split_spec

VERIFIERS_PREFIX = "verifiers:"
DATA_SOURCE = "verifiers"
EXTRA_KEY = "verifiers"
"""``extra_info[EXTRA_KEY]``: ``{"task_type", "data", "config"}`` of the row's task."""


def verifiers_rows(spec: str, num: int, chat: bool = True) -> list[dict[str, Any]]:
    """The first ``num`` tasks of the spec's taskset as rows (module docstring)."""
    taskset = load_taskset(spec)
    rows = []
    for task in itertools.islice(iter(taskset), num):
        data = task.data
        messages = opening_messages(data)
        if not any(m["role"] == "user" for m in messages):
            raise ValueError(f"dataset {spec!r}: task {data.idx} has no user prompt")
        task_type = type(task)
        rows.append(
            {
                "prompt": messages if chat else data.prompt_text,
                "data_source": DATA_SOURCE,
                "extra_info": {
                    EXTRA_KEY: {
                        "task_type": f"{task_type.__module__}:{task_type.__qualname__}",
                        "taskset": spec.removeprefix(VERIFIERS_PREFIX).partition("?")[0],
                        "taskset_config": taskset.config.model_dump(mode="json"),
                        "data": data.model_dump(mode="json"),
                        "config": task.config.model_dump(mode="json"),
                    }
                },
            }
        )
    if not rows and num > 0:
        raise ValueError(f"dataset {spec!r}: the taskset yielded no task")
    return rows


def opening_messages(data: Any) -> list[dict[str, Any]]:
    """A task's opening as chat messages: its system prompt, then its prompt (a string is one
    user message)."""
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        return [*messages, {"role": "user", "content": data.prompt}]
    return messages + [m.model_dump(mode="json", exclude_none=True) for m in data.prompt or []]


def load_taskset(spec: str) -> Any:
    """The taskset the spec names, built with its options (module docstring)."""
    from pydantic import ValidationError
    from verifiers.v1 import Taskset, TasksetConfig
    from verifiers.v1.utils.generic import concrete_type

    path, options = split_spec(spec, VERIFIERS_PREFIX, "a taskset, e.g. verifiers:pkg.mod:Taskset")
    try:
        cls = load_callable(path, "taskset", [None], "(config)")
    except ValueError as exc:
        raise ValueError(f"dataset {spec!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Taskset)):
        raise ValueError(f"dataset {spec!r}: {path} is not a verifiers.v1.Taskset class")
    config_type = concrete_type(cls, TasksetConfig, origin=Taskset) or TasksetConfig
    try:
        config = config_type.model_validate(_nested(options))
    except ValidationError as exc:
        raise ValueError(
            f"dataset {spec!r}: the taskset's config refused the options: {exc}"
        ) from exc
    return cls(config)


def _nested(options: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in options.items():
        *parents, leaf = key.split(".")
        node = out
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return out
