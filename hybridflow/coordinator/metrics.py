"""Run outputs: metrics.jsonl (and the sinks of coordinator.loggers) and the live progress
line. No clients, no RL."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from hybridflow.coordinator.sinks import MetricsSink


class MetricsLog:
    """Appends one JSON object per step to metrics.jsonl (flushed each line), then hands the
    same names and step to each sink (TensorBoard, W&B, MLflow: ``coordinator.loggers``)."""

    def __init__(self, path: Path, sinks: Sequence[MetricsSink] = ()) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a")
        self.sinks = list(sinks)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        record: dict[str, Any] = {"step": step, "time": time.time()}
        record.update({k: (v if math.isfinite(v) else None) for k, v in metrics.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        for sink in self.sinks:
            sink.write(step, metrics)

    def close(self) -> None:
        self._file.close()
        for sink in self.sinks:
            sink.close()


class Progress:
    """A one-line progress bar with live reward on a TTY; periodic lines otherwise."""

    def __init__(self, total: int, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.total = total
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self._tty = self.stream.isatty()
        self._start = time.monotonic()
        self._every = max(1, total // 20)

    def update(self, step: int, reward: float, extra: str = "") -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self._start
        eta = elapsed / step * (self.total - step) if step else 0.0
        width = 30
        filled = int(width * step / self.total)
        bar = "#" * filled + "-" * (width - filled)
        line = (
            f"[{bar}] {step}/{self.total} reward {reward:.3f} "
            f"{elapsed:5.0f}s elapsed, eta {eta:4.0f}s {extra}"
        )
        if self._tty:
            self.stream.write("\r" + line)
            if step == self.total:
                self.stream.write("\n")
        elif step % self._every == 0 or step == self.total or step == 1:
            self.stream.write(line + "\n")
        self.stream.flush()

    def first_step(self, seconds_since_launch: float) -> None:
        """Reports the time from the launch to the end of the first trained step."""
        if self.enabled:
            self.message(f"first trained step {seconds_since_launch:.1f}s after launch")

    def message(self, text: str) -> None:
        if self._tty:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()


def is_eval_line(record: dict[str, Any]) -> bool:
    """Whether a metrics.jsonl line is a held-out evaluation's (``coordinator.eval``: its
    keys are ``eval/<set>/...`` beside ``step`` and ``time``), not a training step's."""
    return any(key.startswith("eval/") for key in record)


def read_step_lines(path: Path) -> list[dict[str, Any]]:
    """The training steps' lines of a metrics.jsonl, in order (the evaluations' lines,
    which sit at the evaluated step after the step they finished in, left out); [] when
    there is no file yet."""
    if not path.exists():
        return []
    lines = (json.loads(x) for x in path.read_text().splitlines() if x.strip())
    return [record for record in lines if not is_eval_line(record)]
