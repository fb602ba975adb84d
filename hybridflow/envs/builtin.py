"""The built-in environments' datasets, by dataset spec: how to make their rows and a
successful conversation for a task (the warm-start demonstrations).

A registry, so the dataset loader and the demonstration writer name no environment."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridflow.envs.base import Message, Task
from hybridflow.envs.calculator import calc_demonstration, make_calc_rows
from hybridflow.envs.guess_number import guess_demonstration, make_guess_rows


@dataclass(frozen=True)
class BuiltinEnvDataset:
    """One built-in environment's task data."""

    make_rows: Callable[[int, int], list[dict[str, Any]]]
    """(num, seed) -> verl rows, deterministic; each row's prompt is the env's opening."""
    demonstration: Callable[[Task], list[Message]]
    """A task -> a full successful conversation (opening messages first)."""


BUILTIN_ENV_DATASETS: dict[str, BuiltinEnvDataset] = {
    "builtin:calc": BuiltinEnvDataset(make_calc_rows, calc_demonstration),
    "builtin:guess": BuiltinEnvDataset(make_guess_rows, guess_demonstration),
}


def builtin_env_dataset(spec: str) -> BuiltinEnvDataset:
    """The registry entry of ``spec``; ValueError listing the known specs."""
    entry = BUILTIN_ENV_DATASETS.get(spec)
    if entry is None:
        raise ValueError(
            f"dataset {spec!r}: not a built-in environment dataset; "
            f"known: {sorted(BUILTIN_ENV_DATASETS)}"
        )
    return entry
