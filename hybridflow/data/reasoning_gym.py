"""reasoning-gym's procedural tasks as prompt datasets: ``reasoning_gym:<task>``, with the
task's options after a ``?`` (``reasoning_gym:basic_arithmetic?max_terms=2&max_digits=1``;
each value read as YAML, so numbers, booleans and lists keep their type).

The dataset's size and seed are the trainer's (``coordinator.data_size`` or an eval set's
``size``, ``coordinator.seed``), so a run is reproducible; a ``seed=`` option wins, so a
held-out set can be the same task under another seed. Each row is the task's question as the
prompt (or, with the reserved option ``prompt=<module:function>``, what that function makes of
the entry: ``prompt=hybridflow.data.reasoning_gym:expression_prompt`` renders
``basic_arithmetic``'s "Calculate 4 + 1." as the built-in model's ``4+1=``), its answer as
the ground truth, the data_source ``reasoning_gym/<task>``, and in ``extra_info`` the whole
entry (question, answer, metadata), from which the reward service's
``reasoning_gym_scorer`` calls the task's own ``score_answer``. A task that does not exist,
an option it does not take or a value it refuses is a ValueError naming the spec before any
row is made.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hybridflow.config.import_path import load_callable
from hybridflow.data.spec_options import split_spec

REASONING_GYM_PREFIX = "reasoning_gym:"
PROMPT_OPTION = "prompt"
"""The one option that is ours, not the task's: an import path of ``fn(entry) -> str``."""
DATA_SOURCE_PREFIX = "reasoning_gym/"
EXTRA_KEY = "reasoning_gym"
"""``extra_info[EXTRA_KEY]``: ``{"task", "entry"}`` of the row (the scorer's input)."""


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """(task, options) of ``reasoning_gym:<task>[?key=value&...]``."""
    return split_spec(spec, REASONING_GYM_PREFIX, "a task, e.g. reasoning_gym:basic_arithmetic")


def reasoning_gym_rows(spec: str, num: int, seed: int, chat: bool) -> list[dict[str, Any]]:
    """``num`` rows of the task (verl's row format); a chat tokenizer gets each question as
    one user message."""
    task, options = parse_spec(spec)
    render = _prompt_fn(spec, options.pop(PROMPT_OPTION, None))
    dataset = _create(spec, task, options, num, seed)
    rows = []
    for i in range(num):
        entry = _plain(dataset[i])
        question = render(entry)
        rows.append(
            {
                "prompt": [{"role": "user", "content": question}] if chat else question,
                "data_source": DATA_SOURCE_PREFIX + task,
                "reward_model": {"ground_truth": str(entry["answer"])},
                "extra_info": {EXTRA_KEY: {"task": task, "entry": entry}},
            }
        )
    return rows


def question_prompt(entry: dict[str, Any]) -> str:
    """The default prompt: the task's own question."""
    return str(entry["question"])


def expression_prompt(entry: dict[str, Any]) -> str:
    """An arithmetic task's ``metadata.expression`` in the built-in ``tiny`` model's format:
    no spaces, then ``=`` (``"4 + 1"`` -> ``"4+1="``); a ValueError for an entry without one."""
    expression = entry.get("metadata", {}).get("expression")
    if not isinstance(expression, str):
        raise ValueError(
            f"expression_prompt: the entry has no metadata.expression (its metadata keys: "
            f"{sorted(entry.get('metadata', {}))})"
        )
    return expression.replace(" ", "") + "="


def _prompt_fn(spec: str, path: Any) -> Callable[[dict[str, Any]], str]:
    if path is None:
        return question_prompt
    if not isinstance(path, str):
        raise ValueError(f"dataset {spec!r}: prompt= must be an import path, got {path!r}")
    try:
        render = load_callable(path, "prompt", [{}], "(entry)")
    except ValueError as exc:
        raise ValueError(f"dataset {spec!r}: {exc}") from exc

    def checked(entry: dict[str, Any]) -> str:
        prompt = render(entry)
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"dataset {spec!r}: {path} returned {prompt!r}, not a prompt")
        return prompt

    return checked


def known_tasks() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _create(spec: str, task: str, options: dict[str, Any], num: int, seed: int) -> Any:
    import reasoning_gym

    if task not in known_tasks():
        raise ValueError(
            f"dataset {spec!r}: reasoning-gym has no task {task!r} (it has "
            f"{len(known_tasks())}: {', '.join(known_tasks()[:12])}, ...)"
        )
    try:
        options = {"seed": seed, **options}  # the spec's own seed= wins: a held-out draw
        return reasoning_gym.create_dataset(task, size=max(num, 1), **options)
    except (TypeError, ValueError, AssertionError) as exc:  # an unknown option, a bad value
        raise ValueError(f"dataset {spec!r}: reasoning-gym refused the options: {exc}") from exc


def _plain(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry as JSON keeps it (tuples become lists; what JSON cannot hold, its text), so
    the scorer sees what the reward service receives."""
    return dict(json.loads(json.dumps(entry, default=str)))
