"""The environment service's conversions round-trip, and its config refuses bad keys by name."""

from __future__ import annotations

import pytest

from hybridflow.config.loader import ConfigError
from hybridflow.envs.base import Message, StepResult, Task
from hybridflow.job_config import JobConfig, load_job_config
from hybridflow.services.environment import convert
from hybridflow.services.environment.config import EnvironmentConfig
from hybridflow.v1 import environment_pb2


@pytest.mark.parametrize(
    "task",
    [
        Task("p"),
        Task("p", ground_truth="", data_source="ds"),  # an empty ground truth is one
        Task("p", ground_truth="42", extra_info={"tools": ["calc"], "n": 1}),
    ],
)
def test_a_task_round_trips(task: Task) -> None:
    wire = environment_pb2.EpisodeTask.FromString(convert.task_to_proto(task).SerializeToString())
    assert convert.task_from_proto(wire) == task


def test_a_step_result_round_trips() -> None:
    result = StepResult(
        observation=(Message("tool", "4"), Message("user", "go on")),
        reward=0.5,
        done=False,
        info={"tool_calls": 1, "success": False},
    )
    wire = environment_pb2.StepResponse.FromString(
        convert.step_to_proto(result, "abc").SerializeToString()
    )
    assert wire.instance == "abc"
    assert convert.step_from_proto(wire) == result


def test_an_unknown_role_is_refused_naming_the_message() -> None:
    msgs = [environment_pb2.ChatMessage(role="user"), environment_pb2.ChatMessage(role="robot")]
    with pytest.raises(ValueError, match=r"messages\[1\].role: unknown role 'robot'"):
        convert.messages_from_proto(msgs)


def test_the_section_loads_and_is_off_by_default(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert not JobConfig().environment.enabled
    path = tmp_path / "job.yaml"
    path.write_text(
        "environment:\n  envs: ['pkg.mod:Env']\n  max_episodes: 8\n"
        "coordinator:\n  multi_turn:\n    env: pkg.mod:Env\n"
    )
    job = load_job_config(path)
    assert job.environment.enabled and job.environment.max_episodes == 8


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        ("environment:\n  envs: ['a:B']\n", "coordinator.multi_turn.env is empty"),
        (
            "environment:\n  envs: ['a:B']\ncoordinator:\n  multi_turn:\n    env: a:C\n",
            "'a:C' is not in environment.envs",
        ),
    ],
)
def test_the_service_and_the_episodes_must_agree(tmp_path, yaml: str, message: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "job.yaml"
    path.write_text(yaml)
    with pytest.raises(Exception, match=message):
        load_job_config(path)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"envs": ["pkg.mod.Env"]}, r"environment.envs\[0\]: expected 'package.module:Class'"),
        ({"envs": ["a:B", "a:B"]}, r"environment.envs\[1\]: 'a:B' is listed twice"),
        ({"max_episodes": 0}, r"environment.max_episodes: must be >= 1"),
        ({"step_timeout_s": 0}, r"environment.step_timeout_s: must be > 0"),
    ],
)
def test_bad_keys_are_named(keys: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EnvironmentConfig(**keys).validate()  # type: ignore[arg-type]


def test_an_unknown_key_is_a_config_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "job.yaml"
    path.write_text("environment:\n  env: ['pkg.mod:Env']\n")
    with pytest.raises(ConfigError, match="environment.env"):
        load_job_config(path)
