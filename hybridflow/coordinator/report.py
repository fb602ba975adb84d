"""The run report: PNG plots of a run's metrics.jsonl, for a person to look at.

``write_report(run_dir)`` reads ``RUN_DIR/metrics.jsonl`` (one JSON object per step, as
``MetricsLog`` writes it) and draws one figure per family of metrics under ``RUN_DIR/report/``:
reward, losses, KL, entropy, throughput, staleness (the async schedule), step timings and the
held-out evaluations (``eval/<set>/...``, beside the training reward, with the offline
evaluations of the run's checkpoints from ``RUN_DIR/eval_offline.jsonl`` as crosses,
``offline/<set>/...``). A family draws only the series the run logged; a family with none is skipped. A run in
progress can be drawn: a partial last line (the writer is mid-line) is ignored.

This module knows metric names and files, not the job: it never imports the coordinator's
state. matplotlib is imported only when a report is drawn (Agg backend, no display).
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
OFFLINE_EVAL_FILE = "eval_offline.jsonl"
"""The offline evaluations of a run's checkpoints (``hybridflow-coordinator eval``): one
line per set, ``{"step", "name", "policy_version", "metrics": {"eval/<set>/...": x}}``."""
REPORT_DIR = "report"


@dataclass(frozen=True)
class Family:
    """One figure: the metrics whose names match ``patterns`` (regexes, full match)."""

    name: str
    """File stem: ``report/<name>.png``."""
    title: str
    patterns: tuple[str, ...]
    shared_axes: bool
    """True: every series on one axes (same unit); False: one panel per series."""
    ylabel: str = ""
    needs: str = ""
    """Drawn only when a series of its own matches this (the evaluation plot: an eval/...
    series, not the training reward it is drawn beside); empty: any of its series."""


FAMILIES: tuple[Family, ...] = (
    Family(
        "reward",
        "Reward",
        (
            r"critic/score/mean",
            r"critic/score/(min|max)",
            r"dynamic_sampling/score_all_mean",
            r"rollout/baseline_score/mean",
            r"reward/(?!num_errors).+/mean",
        ),
        shared_axes=True,
        ylabel="score",
    ),
    Family(
        "losses",
        "Losses",
        (r"actor/pg_loss", r"critic/vf_loss", r"actor/dpo_loss", r"actor/sft_nll"),
        shared_axes=False,
    ),
    Family(
        "kl",
        "KL divergence",
        (r"actor/ppo_kl", r"actor/kl_loss", r"actor/reward_kl_penalty", r"actor/kl_coef"),
        shared_axes=False,
    ),
    Family("entropy", "Policy entropy", (r"actor/entropy",), shared_axes=True, ylabel="nats"),
    Family(
        "throughput",
        "Throughput",
        (
            r"perf/throughput",
            r"perf/samples_per_s",
            r"perf/tokens_per_s_per_device",
            r"perf/mfu",
        ),
        shared_axes=False,
    ),
    Family(
        "staleness",
        "Staleness and the async schedule",
        (r"training/staleness(/.+)?", r"async/.+"),
        shared_axes=False,
    ),
    Family("timing", "Step timings", (r"timing_s/.+",), shared_axes=True, ylabel="seconds"),
    Family(
        "eval",
        "Held-out evaluation beside the training reward",
        (
            r"eval/[^/]+/(pass@\d+|mean@\d+|majority@\d+|success_rate)",
            r"offline/[^/]+/(pass@\d+|mean@\d+|majority@\d+|success_rate)",
            r"critic/score/mean",
        ),
        shared_axes=True,
        ylabel="score",
        needs=r"(eval|offline)/.+",
    ),
)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The step records of ``path``. A last line that does not parse is a step being
    written (a run in progress) and is left out; a bad line before it is a ValueError
    naming the file and line."""
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: not a JSON line ({exc.msg})") from exc
        if isinstance(record, dict) and "step" in record:
            records.append(record)
    return records


def series(records: list[dict[str, Any]]) -> dict[str, tuple[list[float], list[float]]]:
    """Each numeric metric as (steps, values), in file order, over the records that hold it
    (a training step's line, an evaluation's: ``eval/...``); a null (non-finite when logged)
    value is NaN, so a line shows a gap instead of a false point."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for record in records:
        for key, value in record.items():
            if key not in ("step", "time") and (value is None or _is_number(value)):
                steps, values = out.setdefault(key, ([], []))
                steps.append(float(record["step"]))
                values.append(_as_float(value))
    return out


def offline_records(path: Path) -> list[dict[str, Any]]:
    """The lines of an ``eval_offline.jsonl`` as records of ``series``: each set's metrics
    renamed ``offline/<set>/...`` at its checkpoint's step (none when the file is missing;
    a line that does not parse is skipped: the file is a convenience of the report)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            raw = json.loads(line)
            metrics = {
                "offline/" + k.removeprefix("eval/"): v for k, v in dict(raw["metrics"]).items()
            }
            out.append({"step": int(raw["step"]), **metrics})
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def family_series(family: Family, available: list[str]) -> list[str]:
    """The metric names of ``available`` this family draws, in pattern order."""
    chosen: list[str] = []
    for pattern in family.patterns:
        regex = re.compile(pattern)
        chosen += sorted(n for n in available if regex.fullmatch(n) and n not in chosen)
    return chosen


def write_report(run_dir: Path) -> list[Path]:
    """Draws ``run_dir/report/<family>.png`` for every family with data; returns the files.
    FileNotFoundError: no metrics.jsonl; ValueError: it holds no step yet."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (is {run_dir} a run directory?)")
    records = read_metrics(path)
    if not records:
        raise ValueError(f"{path} holds no step yet")
    data = series(records + offline_records(Path(run_dir) / OFFLINE_EVAL_FILE))
    out_dir = Path(run_dir) / REPORT_DIR
    out_dir.mkdir(exist_ok=True)
    written = []
    for family in FAMILIES:
        names = family_series(family, list(data))
        if names and (not family.needs or any(re.fullmatch(family.needs, n) for n in names)):
            target = out_dir / f"{family.name}.png"
            _draw(family, {n: data[n] for n in names}, target, title_suffix=Path(run_dir).name)
            written.append(target)
    return written


def write_report_logged(run_dir: Path, log: logging.Logger) -> list[Path]:
    """``write_report`` at the end of a run: a report is a convenience, so any failure to
    draw it (no matplotlib, a full disk, a matplotlib bug) is one logged line, never a
    failed run."""
    try:
        files = write_report(run_dir)
    except Exception as exc:  # broad on purpose: see the docstring
        log.warning("run report not drawn: %s: %s", type(exc).__name__, exc)
        return []
    log.info("run report: %s (%d plots)", Path(run_dir) / REPORT_DIR, len(files))
    return files


def _draw(
    family: Family,
    data: dict[str, tuple[list[float], list[float]]],
    target: Path,
    title_suffix: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, also without $DISPLAY
    import matplotlib.pyplot as plt

    num_panels = 1 if family.shared_axes else len(data)
    fig, axes = plt.subplots(
        num_panels, 1, sharex=True, figsize=(8, 2.2 + 2.0 * num_panels), squeeze=False
    )
    try:
        panels = [axes[i][0] for i in range(num_panels)]
        for i, (name, (steps, values)) in enumerate(data.items()):
            ax = panels[0 if family.shared_axes else i]
            # A short run, or an evaluation's few points: show the points.
            marker = "o" if len(steps) < 30 or name.startswith("eval/") else None
            if name.startswith("offline/"):  # a checkpoint's evaluation: crosses, no line
                ax.plot(steps, values, "x", label=name, markersize=8)
            else:
                ax.plot(steps, values, label=name, marker=marker, markersize=3)
            ax.set_ylabel(family.ylabel if family.shared_axes else name)
            ax.grid(True, alpha=0.3)
        if family.shared_axes:
            panels[0].legend(loc="best", fontsize="small")
        panels[-1].set_xlabel("step")
        fig.suptitle(f"{family.title} — {title_suffix}")
        height = fig.get_size_inches()[1]
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / height))  # room for the title
        fig.savefig(target, dpi=100)
    finally:
        plt.close(fig)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_float(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return math.nan
