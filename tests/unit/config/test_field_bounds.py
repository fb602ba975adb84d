"""Every config field declares its bound once, on the field (issue 21): its type bounds it
(bool, Literal, a nested section), or ``knob`` gives a bound or the reason it has none. And
real refusals, end to end through the job loader, name the key."""

from __future__ import annotations

import dataclasses
import logging
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from hybridflow.config import loader
from hybridflow.config.fields import FREE, bound_of, knob, typed_bound
from hybridflow.config.loader import ConfigError, load_config
from hybridflow.job_config import JobConfig, load_job_config
from hybridflow.loadgen.config import LoadgenConfig

PENDING: set[str] = set()
"""Sections of JobConfig not walked yet (none since the learner's nested config)."""

ROOTS: tuple[type, ...] = (JobConfig, LoadgenConfig)


def _dataclasses_in(tp: Any) -> Iterator[type]:
    """The config dataclasses a field's type holds: itself, or inside list / Optional."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        yield tp
    for arg in typing.get_args(tp):
        yield from _dataclasses_in(arg)


def sections(root: type) -> list[type]:
    """``root`` and every config dataclass reachable from its fields (nested sections and
    list items), each once; JobConfig's ``PENDING`` sections are left out."""
    found: list[type] = []
    todo = [root]
    while todo:
        cls = todo.pop()
        if cls in found:
            continue
        found.append(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if cls is JobConfig and f.name in PENDING:
                continue
            todo.extend(_dataclasses_in(hints[f.name]))
    return found


def unbounded(cls: type) -> list[str]:
    """``Section.field`` of each field of ``cls`` with neither a bounding type, a ``knob``
    bound nor a ``knob(free=...)`` reason."""
    hints = typing.get_type_hints(cls)
    return [
        f"{cls.__name__}.{f.name}"
        for f in dataclasses.fields(cls)
        if not (typed_bound(hints[f.name]) or bound_of(f) or FREE in f.metadata)
    ]


def test_every_field_has_a_bound_or_a_reason() -> None:
    missing = [name for root in ROOTS for cls in sections(root) for name in unbounded(cls)]
    assert not missing, (
        "give these a bound (knob(default, ge=...)) or a reason (knob(default, free='why')): "
        + ", ".join(missing)
    )


def test_the_walk_reaches_nested_sections_and_list_items() -> None:
    names = {cls.__name__ for root in ROOTS for cls in sections(root)}
    assert {"ServerConfig", "ChannelConfig", "SamplingConfig", "RewardComponent"} <= names
    assert {"RolloutLoadConfig", "RewardLoadConfig", "DeployConfig"} <= names
    assert {"LearnerConfig", "OptimizerConfig", "TopologyConfig", "LearnerMemoryConfig"} <= names


def test_pending_sections_are_job_sections() -> None:
    assert PENDING <= {f.name for f in dataclasses.fields(JobConfig)}


@dataclass
class _Loose:
    """A section with one field of each kind."""

    flag: bool = False
    count: int = knob(1, ge=1)
    path: str = knob("", free="a path")
    name: str = ""
    size: int = 0


def test_an_unbounded_field_is_named_with_its_section() -> None:
    assert unbounded(_Loose) == ["_Loose.name", "_Loose.size"]


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["rollout.max_n=0"], "rollout.max_n: must be >= 1, got 0"),
        (["rollout.message_bytes=10"], "rollout.message_bytes: must be >= 1024, got 10"),
        (["reward.score_workers=0"], "reward.score_workers: must be >= 1, got 0"),
        (["reward.num_threads=0"], "reward.score_workers: must be >= 1, got 0"),
        (["reward.max_text_bytes=0"], "reward.max_text_bytes: must be >= 1, got 0"),
        (
            ["reward.components=[{name: a, weight: .inf}]"],
            "reward.components[0].weight: must be a finite number, got inf",
        ),
        (
            ["rollout.server.stream_idle_timeout_s=0"],
            "server.stream_idle_timeout_s: must be > 0, got 0",
        ),
        (["reward.server.reserved_workers=0"], "server.reserved_workers: must be >= 1, got 0"),
        (
            ["coordinator.channel.chunk_bytes=1"],
            "channel.chunk_bytes: must be in [65536, 4194304], got 1",
        ),
        (["weight_sync.connect_timeout_s=0"], "weight_sync.connect_timeout_s: must be > 0, got 0"),
        (
            ["preference.label_smoothing=0.5"],
            "preference.label_smoothing: must be in [0, 0.5), got 0.5",
        ),
        (["deploy.restart_budget=-1"], "deploy.restart_budget: must be >= 0, got -1"),
    ],
)
def test_a_bad_value_is_refused_naming_its_key(overrides: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_job_config(None, overrides)
    assert line in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["rollout.replicas=2", "rollout.devices=['0']"], "one entry per replica"),
        (["rollout.tensor_parallel_size=2"], "needs rollout.engine=vllm"),
        (["rollout.server.metrics_port=9000", "rollout.server.port=9000"], "must differ"),
        (["reward.server.tls_cert=c.pem"], "must be set together"),
        (["reward.scorers={x: no_colon}"], "reward.scorers['x']: expected"),
        (["weight_sync.allowed_hosts=[]"], "list at least one host"),
    ],
)
def test_checks_between_fields_still_refuse(overrides: list[str], words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_job_config(None, overrides)


def test_model_bounds_of_a_rule_component_do_not_apply() -> None:
    job = load_job_config(None, ["reward.components=[{name: a, batch_size: 0}]"])
    assert job.reward.components[0].batch_size == 0
    with pytest.raises(ConfigError, match=r"components\[0\].batch_size: must be >= 1"):
        load_job_config(
            None, ["reward.components=[{name: a, kind: model, model: m, batch_size: 0}]"]
        )


def test_the_old_reward_num_threads_key_loads_as_score_workers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(loader, "_noticed", set())
    with caplog.at_level(logging.WARNING, logger="hybridflow.config.loader"):
        job = load_job_config(None, ["reward.num_threads=3"])
    assert job.reward.score_workers == 3
    assert [r.getMessage() for r in caplog.records] == [
        "config: 'reward.num_threads' is now 'reward.score_workers' (the old key still works, "
        "for now)"
    ]


def test_a_bad_loadgen_value_is_refused_naming_its_key() -> None:
    base = ["address=127.0.0.1:1", "duration_s=1"]
    with pytest.raises(ConfigError, match=r"sweep_concurrency\[1\]: must be in \[1, 1024\], got 0"):
        load_config(LoadgenConfig, None, [*base, "sweep_concurrency=[1, 0]"])
    with pytest.raises(ConfigError, match=r"rollout.top_p: must be in \(0, 1\], got 0"):
        load_config(LoadgenConfig, None, [*base, "rate=1", "rollout.top_p=0"])
