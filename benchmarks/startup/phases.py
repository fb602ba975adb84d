"""Where the start went: a phase table of one launched run, from what its processes logged.

Reads ``RUN_DIR/startup.jsonl`` (the start-up marks every process of the job appends:
``hybridflow/utils/startup_marks.py``), and ``events.jsonl`` / ``metrics.jsonl`` for the first
step (its generate, score, train and weight sync), and prints, per process, each phase with
when it ended (seconds since the launch), its wall seconds and its CPU seconds:

    python benchmarks/startup/phases.py RUN_DIR [--json]

Example rows: ``learner0 imported`` is the seconds from ``main`` until torch, transformers
and the learner's modules were imported; ``launcher learner0_healthy`` is when the
launcher's health check first saw the learner serving. CPU seconds are the process's own;
on a machine of 2 cores the start is CPU-bound, so the CPU column is the one that moves
when a phase gets cheaper, and the wall column the one the user waits for.
``run_startup.py`` prints the medians of this table for each tree it compares.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PROCESS_ORDER = ("launcher", "reward", "learner", "rollout", "coordinator", "first_step")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _last_launch(marks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The marks of the newest launch (a resumed run dir holds every launch's)."""
    starts = [
        i for i, m in enumerate(marks) if m["process"] == "launcher" and m["phase"] == "start"
    ]
    return marks[starts[-1] :] if starts else marks


def phase_rows(run_dir: Path) -> list[dict[str, Any]]:
    """One row per phase: ``process``, ``phase``, ``at_s`` (end, seconds since the launch),
    ``wall_s`` and ``cpu_s`` (since the process's previous mark). The first step's
    generate, score, train and sync come from events.jsonl as process ``first_step``."""
    marks = _last_launch(read_jsonl(run_dir / "startup.jsonl"))
    if not marks:
        raise ValueError(f"{run_dir}/startup.jsonl has no marks (a run launched before them?)")
    origin = next(
        (m["time"] for m in marks if m["process"] == "launcher" and m["phase"] == "start"),
        min(m["time"] for m in marks),
    )
    rows: list[dict[str, Any]] = []
    by_process: dict[str, list[dict[str, Any]]] = {}
    for m in marks:
        by_process.setdefault(m["process"], []).append(m)
    for name in sorted(by_process, key=_process_rank):
        previous: dict[str, Any] | None = None
        for m in sorted(by_process[name], key=lambda m: m["time"]):
            rows.append(
                {
                    "process": name,
                    "phase": m["phase"],
                    "at_s": m["time"] - origin,
                    "wall_s": m["time"] - (previous["time"] if previous else origin),
                    "cpu_s": m["cpu_s"] - (previous["cpu_s"] if previous else 0.0),
                }
            )
            previous = m
    rows.extend(_first_step_rows(run_dir, origin))
    return rows


def _process_rank(name: str) -> tuple[int, str]:
    stem = name.rstrip("0123456789")
    return (PROCESS_ORDER.index(stem) if stem in PROCESS_ORDER else len(PROCESS_ORDER), name)


def _first_step_rows(run_dir: Path, origin: float) -> list[dict[str, Any]]:
    """The first step's events (each kind's first, in start order: its duration is the wall
    column; no CPU column) and its end, from the first metrics.jsonl line."""
    first: dict[str, dict[str, Any]] = {}
    for event in read_jsonl(run_dir / "events.jsonl"):
        if event.get("kind") in ("generate", "score", "train", "sync"):
            first.setdefault(event["kind"], event)
    rows = [
        {
            "process": "first_step",
            "phase": kind,
            "at_s": e["start"] + e["duration_s"] - origin,
            "wall_s": e["duration_s"],
            "cpu_s": None,
        }
        for kind, e in sorted(first.items(), key=lambda kv: kv[1]["start"])
    ]
    metrics = [  # an evaluation's line (only eval/... keys) is not a step's end
        m
        for m in read_jsonl(run_dir / "metrics.jsonl")
        if not any(k.startswith("eval/") for k in m)
    ]
    if metrics:
        end = metrics[0]["time"] - origin
        rows.append(
            {"process": "first_step", "phase": "done", "at_s": end, "wall_s": None, "cpu_s": None}
        )
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    def num(value: float | None) -> str:
        return f"{value:8.2f}" if value is not None else f"{'':8}"

    lines = [f"{'process':14}{'phase':22}{'at_s':>8}{'wall_s':>8}{'cpu_s':>8}"]
    for r in rows:
        lines.append(
            f"{r['process']:14}{r['phase']:22}{num(r['at_s'])}{num(r['wall_s'])}{num(r['cpu_s'])}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a run directory written by deploy/launch.sh")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    try:
        rows = phase_rows(Path(args.run_dir))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=2) if args.json else format_rows(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
