"""Metrics sinks beyond metrics.jsonl: TensorBoard, Weights & Biases, MLflow.

``coordinator.loggers`` names them; each gets the same metric names as metrics.jsonl and the
global step as its step. Only non-finite values differ: JSONL writes them as null, a sink
leaves them out (none of the three stores a missing value). The optional packages are
imported when a sink is built, so this module imports without any of them.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

LOGGERS = ("jsonl", "tensorboard", "wandb", "mlflow")
"""The names ``coordinator.loggers`` accepts; jsonl is always on."""


class MetricsSink(Protocol):
    """Receives each step's metrics after metrics.jsonl has them."""

    def write(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def finite(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics a sink records: the finite ones (JSONL writes the others as null)."""
    return {k: float(v) for k, v in metrics.items() if math.isfinite(v)}


class TensorBoardSink:
    """Scalar summaries in TensorBoard event files under ``log_dir`` (one tag per metric)."""

    def __init__(self, log_dir: Path) -> None:
        _require("tensorboard", "tensorboard")
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self._event = event_pb2.Event
        self._summary = summary_pb2.Summary
        self._writer = EventFileWriter(str(log_dir))

    def write(self, step: int, metrics: dict[str, float]) -> None:
        values = [self._summary.Value(tag=k, simple_value=v) for k, v in finite(metrics).items()]
        summary = self._summary(value=values)
        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=summary))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """One W&B run per job run. W&B reads WANDB_MODE itself (offline: files under the run
    dir, synced later with ``wandb sync``); WANDB_PROJECT picks the project.

    W&B drops a line whose step is below its current one, and a held-out evaluation's line
    comes after the step it finished in (the step-0 evaluation after step 1's line): so the
    ``eval/*`` metrics are drawn against their own axis, ``eval/step`` (the evaluated step),
    and logged at the current step."""

    EVAL_STEP = "eval/step"

    def __init__(self, run_dir: Path) -> None:
        wandb = _require("wandb", "wandb")
        project = os.environ.get("WANDB_PROJECT", "hybridflow")
        self._run = wandb.init(project=project, name=run_dir.name, dir=str(run_dir))
        self._run.define_metric(self.EVAL_STEP)
        self._run.define_metric("eval/*", step_metric=self.EVAL_STEP)
        self._step = 0

    def write(self, step: int, metrics: dict[str, float]) -> None:
        values = finite(metrics)
        if any(key.startswith("eval/") for key in values):
            values[self.EVAL_STEP] = float(step)
            step = max(step, self._step)
        self._step = max(self._step, step)
        self._run.log(values, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowSink:
    """One MLflow run per job run, on the tracking URI mlflow resolves (MLFLOW_TRACKING_URI,
    else ./mlruns)."""

    def __init__(self, run_dir: Path) -> None:
        self._mlflow: Any = _require("mlflow", "mlflow")
        self._mlflow.start_run(run_name=run_dir.name)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        self._mlflow.log_metrics(finite(metrics), step=step)

    def close(self) -> None:
        self._mlflow.end_run()


def build_sinks(names: Sequence[str], run_dir: Path) -> list[MetricsSink]:
    """The sinks ``coordinator.loggers`` names besides jsonl (which MetricsLog writes)."""
    sinks: list[MetricsSink] = []
    for name in dict.fromkeys(names):
        if name == "tensorboard":
            sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        elif name == "wandb":
            sinks.append(WandbSink(run_dir))
        elif name == "mlflow":
            sinks.append(MlflowSink(run_dir))
        elif name != "jsonl":
            raise ValueError(f"coordinator.loggers: unknown logger {name!r}")
    return sinks


def _require(logger: str, package: str) -> ModuleType:
    """Imports an optional package, or says which key asked for it."""
    try:
        return import_module(package)
    except ImportError:
        raise ValueError(
            f"coordinator.loggers: {logger!r} needs the {package} package, which is not "
            f"installed (pip install {package}, or drop it from the list)"
        ) from None
