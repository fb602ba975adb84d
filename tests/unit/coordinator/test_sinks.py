"""coordinator.loggers: TensorBoard files of a short run hold metrics.jsonl's names and steps;
W&B and MLflow (fakes in sys.modules) get the same; unknown or missing loggers name the key."""

import json
import math
import sys
import types

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.metrics import MetricsLog
from hybridflow.coordinator.services import Services
from hybridflow.coordinator.sinks import build_sinks

from .fakes import FakeLearner, FakeReward, FakeRollout, records


def fake_services():
    rollouts = [FakeRollout(), FakeRollout()]
    return Services(
        rollouts,
        FakeReward(),
        FakeLearner(rollouts),
        ["r0", "r1"],
        decode=lambda ids: "".join(map(str, ids)),
    )


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_tensorboard_files_of_a_short_run_hold_the_jsonl_series(tmp_path):
    cfg = CoordinatorConfig(
        num_steps=3, prompts_per_step=4, group_size=2, progress=False, loggers=["tensorboard"]
    )
    TrainingJob(cfg, fake_services(), records(12), tmp_path).run()
    lines = read_jsonl(tmp_path / "metrics.jsonl")  # jsonl is on although not listed
    assert [line["step"] for line in lines] == [1, 2, 3]
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    expected = {k for line in lines for k, v in line.items() if k not in ("step", "time")}
    assert "critic/score/mean" in expected
    assert set(acc.Tags()["scalars"]) == {
        k for k in expected if all(line[k] is not None for line in lines)
    }
    for tag in ("critic/score/mean", "async/buffered"):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [1, 2, 3]
        assert [e.value for e in events] == pytest.approx([line[tag] for line in lines])


def test_non_finite_values_are_null_in_jsonl_and_absent_from_sinks(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl", build_sinks(["tensorboard"], tmp_path))
    log.write(7, {"a": 1.5, "b": math.nan, "c": math.inf})
    log.close()
    (line,) = read_jsonl(tmp_path / "metrics.jsonl")
    assert (line["step"], line["a"], line["b"], line["c"]) == (7, 1.5, None, None)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert acc.Tags()["scalars"] == ["a"]
    assert [(e.step, e.value) for e in acc.Scalars("a")] == [(7, 1.5)]


class FakeWandbRun:
    def __init__(self, calls):
        self.calls = calls

    def log(self, metrics, step):
        self.calls.append(("log", dict(metrics), step))

    def define_metric(self, name, step_metric=None):
        self.calls.append(("define", name, step_metric))

    def finish(self):
        self.calls.append(("finish",))


def test_wandb_sink_logs_the_same_names_and_steps(tmp_path, monkeypatch):
    calls = []
    wandb = types.ModuleType("wandb")
    wandb.init = lambda **kw: calls.append(("init", kw)) or FakeWandbRun(calls)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setenv("WANDB_PROJECT", "proj")
    log = MetricsLog(tmp_path / "metrics.jsonl", build_sinks(["jsonl", "wandb"], tmp_path))
    log.write(1, {"critic/score/mean": 0.5, "x": math.nan})
    log.write(0, {"eval/test/pass@1": 0.25})  # the step-0 evaluation, after step 1's line
    log.write(2, {"critic/score/mean": 0.75, "x": 2.0})
    log.close()
    assert calls == [
        ("init", {"project": "proj", "name": tmp_path.name, "dir": str(tmp_path)}),
        ("define", "eval/step", None),
        ("define", "eval/*", "eval/step"),
        ("log", {"critic/score/mean": 0.5}, 1),
        # W&B drops a step below its current one: at step 1, drawn against eval/step 0
        ("log", {"eval/test/pass@1": 0.25, "eval/step": 0.0}, 1),
        ("log", {"critic/score/mean": 0.75, "x": 2.0}, 2),
        ("finish",),
    ]


def test_mlflow_sink_logs_the_same_names_and_steps(tmp_path, monkeypatch):
    calls = []
    mlflow = types.ModuleType("mlflow")
    mlflow.start_run = lambda run_name: calls.append(("start", run_name))
    mlflow.log_metrics = lambda metrics, step: calls.append(("log", dict(metrics), step))
    mlflow.end_run = lambda: calls.append(("end",))
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    log = MetricsLog(tmp_path / "metrics.jsonl", build_sinks(["mlflow"], tmp_path))
    log.write(4, {"loss": 1.25})
    log.close()
    assert calls == [("start", tmp_path.name), ("log", {"loss": 1.25}, 4), ("end",)]


def test_a_listed_logger_that_is_not_installed_names_the_key(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(ValueError, match=r"coordinator.loggers: 'wandb' needs the wandb package"):
        build_sinks(["wandb"], tmp_path)


def test_unknown_logger_is_refused_naming_the_key():
    CoordinatorConfig(loggers=["jsonl", "tensorboard", "wandb", "mlflow"]).validate()
    CoordinatorConfig(loggers=[]).validate()  # jsonl is written anyway
    with pytest.raises(ValueError, match=r"coordinator.loggers: unknown 'csv'; known: jsonl"):
        CoordinatorConfig(loggers=["tensorboard", "csv"]).validate()
