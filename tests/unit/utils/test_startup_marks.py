"""Start-up marks: each process appends its phases to the launcher's file, nothing without
it; ``benchmarks/startup/phases.py`` turns a run dir's marks into the phase table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.startup.phases import format_rows, phase_rows
from hybridflow.utils.startup_marks import ENV, mark, mark_process_start, process_start_time


def test_marks_append_one_line_each_with_time_and_cpu(tmp_path, monkeypatch):
    path = tmp_path / "startup.jsonl"
    monkeypatch.setenv(ENV, str(path))
    before = time.time()
    mark("reward", "imported")
    mark("reward", "serving", at=before - 1.0, cpu_s=0.5)
    first, second = [json.loads(x) for x in path.read_text().splitlines()]
    assert first["process"] == "reward" and first["phase"] == "imported"
    assert before <= first["time"] <= time.time()
    assert first["cpu_s"] >= 0.0 and first["pid"] == os.getpid()
    assert (second["time"], second["cpu_s"]) == (before - 1.0, 0.5)


def test_without_the_launcher_no_file_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    mark("reward", "serving")
    mark_process_start("reward")
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_file_never_stops_a_start(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "missing-dir" / "startup.jsonl"))
    mark("reward", "serving")  # no exception
    assert list(tmp_path.iterdir()) == []  # and nothing written elsewhere


def test_a_child_s_start_time_is_when_it_was_spawned(tmp_path):
    path = tmp_path / "startup.jsonl"
    code = "from hybridflow.utils.startup_marks import mark_process_start; mark_process_start('x')"
    before = time.time()
    subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, ENV: str(path)}, check=True, timeout=60
    )
    after = time.time()
    start, main = [json.loads(x) for x in path.read_text().splitlines()]
    assert (start["phase"], main["phase"]) == ("process_start", "main")
    # /proc's clock ticks are 10 ms; the uptime reading rounds to 10 ms as well.
    assert before - 0.05 <= start["time"] <= main["time"] + 0.05
    assert main["time"] <= after
    assert start["cpu_s"] == 0.0
    own = process_start_time()
    assert own is not None and own <= time.time()


def _write(path: Path, rows: list[dict]) -> None:  # type: ignore[type-arg]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_phase_table_counts_from_the_newest_launch(tmp_path):
    t0 = 1000.0
    old = [{"process": "launcher", "phase": "start", "time": t0 - 500, "cpu_s": 0.0, "pid": 1}]
    marks = [
        {"process": "launcher", "phase": "start", "time": t0, "cpu_s": 0.0, "pid": 2},
        {"process": "learner0", "phase": "process_start", "time": t0 + 0.5, "cpu_s": 0.0},
        {"process": "learner0", "phase": "main", "time": t0 + 0.75, "cpu_s": 0.2},
        {"process": "learner0", "phase": "imported", "time": t0 + 3.0, "cpu_s": 2.0},
        {"process": "launcher", "phase": "learner0_healthy", "time": t0 + 3.5, "cpu_s": 0.5},
    ]
    _write(tmp_path / "startup.jsonl", old + marks)
    _write(
        tmp_path / "events.jsonl",
        [
            {"kind": "generate", "start": t0 + 4.0, "duration_s": 0.25},
            {"kind": "train", "start": t0 + 4.5, "duration_s": 0.5},
            {"kind": "generate", "start": t0 + 5.0, "duration_s": 0.25},  # not the first
        ],
    )
    _write(tmp_path / "metrics.jsonl", [{"step": 1, "time": t0 + 5.5}])
    rows = phase_rows(tmp_path)
    table = {(r["process"], r["phase"]): r for r in rows}
    assert [r["process"] for r in rows][:2] == ["launcher", "launcher"]  # launcher first
    assert table[("learner0", "imported")]["at_s"] == pytest.approx(3.0)
    assert table[("learner0", "imported")]["wall_s"] == pytest.approx(2.25)
    assert table[("learner0", "imported")]["cpu_s"] == pytest.approx(1.8)
    assert table[("learner0", "process_start")]["wall_s"] == pytest.approx(0.5)
    assert table[("first_step", "generate")]["wall_s"] == pytest.approx(0.25)
    assert table[("first_step", "train")]["at_s"] == pytest.approx(5.0)
    assert table[("first_step", "done")]["at_s"] == pytest.approx(5.5)
    assert "learner0_healthy" in format_rows(rows)


def test_a_run_without_marks_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no marks"):
        phase_rows(tmp_path)


def test_run_startup_reports_each_phase_s_median_and_blanks_for_a_tree_without_marks():
    from benchmarks.startup.run_startup import format_phases, phase_medians

    def row(at: float, cpu: float) -> dict:  # type: ignore[type-arg]
        return {"process": "learner0", "phase": "imported", "at_s": at, "wall_s": at, "cpu_s": cpu}

    runs = [{"phases": [row(3.0, 1.0)]}, {"phases": [row(5.0, 2.0)]}, {"phases": [row(4.0, 9.0)]}]
    medians = phase_medians(runs)
    assert medians["learner0/imported"] == {"at_s": 4.0, "wall_s": 4.0, "cpu_s": 2.0}
    report = {"phase_medians": {"baseline": phase_medians([{"phases": []}]), "tree": medians}}
    table = format_phases(report, ["baseline", "tree"])
    assert "learner0/imported" in table and "4.00" in table
