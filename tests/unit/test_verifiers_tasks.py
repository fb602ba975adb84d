"""``verifiers:<module:Taskset>`` datasets: the taskset's tasks as rows that rebuild them, its
config set from the spec's options, and a bad spec refused up front naming it."""

from __future__ import annotations

import pytest

from hybridflow.agents.verifiers_env import rebuild_task
from hybridflow.data.datasets import generated_problem, is_generated
from hybridflow.data.verifiers_tasks import verifiers_rows
from hybridflow.envs.base import Task
from hybridflow.envs.verifiers_examples import CalcConfig, CalcTaskset

CALC = "verifiers:hybridflow.envs.verifiers_examples:CalcTaskset"


def test_rows_are_the_tasksets_tasks_in_order_and_rebuild_them():
    rows = verifiers_rows(f"{CALC}?num_tasks=5&seed=2", 3)
    tasks = list(CalcTaskset(CalcConfig(num_tasks=5, seed=2)))[:3]
    assert len(rows) == 3 and is_generated(CALC)
    for row, task in zip(rows, tasks, strict=True):
        assert row["data_source"] == "verifiers"
        assert row["prompt"] == [
            {"role": "system", "content": task.data.system_prompt},
            {"role": "user", "content": task.data.prompt},
        ]
        again, taskset_cls, config = rebuild_task(
            Task(task.data.prompt, None, "verifiers", row["extra_info"])
        )
        assert again.data == task.data and again.key == task.key
        assert taskset_cls is CalcTaskset and config == CalcConfig(num_tasks=5, seed=2)
    assert verifiers_rows(f"{CALC}?num_tasks=2", 10) == verifiers_rows(f"{CALC}?num_tasks=2", 2)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("verifiers:", "name a taskset"),
        ("verifiers:nowhere.at_all:Taskset", "cannot import 'nowhere.at_all'"),
        ("verifiers:hybridflow.envs.verifiers_examples:CalcTask", "is not a verifiers.v1.Taskset"),
        (f"{CALC}?num_tasks=many", "the taskset's config refused the options"),
        (f"{CALC}?num_tasks=0", "the taskset yielded no task"),
        (f"{CALC}?num_tasks", "is not key=value"),
    ],
)
def test_a_bad_spec_is_refused_naming_it(spec, says):
    problem = generated_problem(spec)
    assert problem is not None and spec in problem and says in problem
