"""The run report: PNGs from a run's metrics.jsonl (also a run in progress), and the
``hybridflow-coordinator report`` command."""

import json
import logging
import subprocess
import sys

import numpy as np
import pytest

from hybridflow.coordinator.report import (
    FAMILIES,
    family_series,
    offline_records,
    read_metrics,
    series,
    write_report,
    write_report_logged,
)
from hybridflow.main.coordinator import main

LINE_BLUE = np.array([0x1F, 0x77, 0xB4]) / 255  # matplotlib's first line colour (C0)


def _step(step: int) -> dict:
    return {
        "step": step,
        "time": 1000.0 + step,
        "critic/score/mean": 0.1 * step,
        "critic/score/max": 0.2 * step,
        "actor/pg_loss": 1.0 / step,
        "critic/vf_loss": 0.5 / step,
        "actor/ppo_kl": 0.01 * step,
        "actor/entropy": 2.0 - 0.1 * step,
        "perf/throughput": 100.0 + step,
        "perf/samples_per_s": 4.0,
        "async/lead_steps": float(step % 2),
        "timing_s/step": 1.5,
        "timing_s/gen": None,  # non-finite when logged: a gap
    }


def _write_metrics(run_dir, num_steps, partial_tail=""):  # type: ignore[no-untyped-def]
    text = "".join(json.dumps(_step(s)) + "\n" for s in range(1, num_steps + 1))
    (run_dir / "metrics.jsonl").write_text(text + partial_tail)


def _has_line(path) -> bool:  # type: ignore[no-untyped-def]
    """The PNG is not blank: it has pixels of the first line's colour."""
    import matplotlib.image as mpimg

    image = mpimg.imread(str(path))[..., :3]
    return bool((np.abs(image - LINE_BLUE).max(axis=-1) < 0.05).sum() > 20)


def test_report_draws_every_family_with_data(tmp_path):
    _write_metrics(tmp_path, num_steps=5)
    files = write_report(tmp_path)
    names = sorted(p.name for p in files)
    assert names == [
        "entropy.png",
        "kl.png",
        "losses.png",
        "reward.png",
        "staleness.png",
        "throughput.png",
        "timing.png",
    ]
    for path in files:
        assert path.parent == tmp_path / "report"
        assert path.stat().st_size > 0
        assert _has_line(path), path.name


def test_offline_evaluations_join_the_eval_plot_at_their_checkpoints_steps(tmp_path):
    _write_metrics(tmp_path, num_steps=4)
    line = {"step": 2, "name": "held", "policy_version": 2, "metrics": {"eval/held/pass@1": 0.4}}
    (tmp_path / "eval_offline.jsonl").write_text(json.dumps(line) + "\n" + "cut sh")
    records = offline_records(tmp_path / "eval_offline.jsonl")
    assert records == [{"step": 2, "offline/held/pass@1": 0.4}]
    data = series(records)
    assert data["offline/held/pass@1"] == ([2.0], [0.4])
    eval_family = next(f for f in FAMILIES if f.name == "eval")
    assert family_series(eval_family, [*data, "critic/score/mean"]) == [
        "offline/held/pass@1",
        "critic/score/mean",
    ]
    files = write_report(tmp_path)
    assert tmp_path / "report" / "eval.png" in files  # an offline point alone draws it
    assert offline_records(tmp_path / "missing.jsonl") == []


def test_missing_series_are_skipped(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "time": 0.0, "critic/score/mean": 0.5}) + "\n"
    )
    assert [p.name for p in write_report(tmp_path)] == ["reward.png"]


def test_a_run_in_progress_has_a_partial_last_line(tmp_path):
    _write_metrics(tmp_path, num_steps=3, partial_tail='{"step": 4, "critic/sc')
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    files = write_report(tmp_path)
    assert (tmp_path / "report" / "reward.png") in files
    assert all(_has_line(p) for p in files)


def test_a_bad_line_before_the_last_is_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON line"):
        read_metrics(tmp_path / "metrics.jsonl")


def test_families_pick_their_series_by_name():
    available = ["critic/score/mean", "reward/math/mean", "reward/num_errors", "async/buffered"]
    reward = next(f for f in FAMILIES if f.name == "reward")
    assert family_series(reward, available) == ["critic/score/mean", "reward/math/mean"]
    staleness = next(f for f in FAMILIES if f.name == "staleness")
    assert family_series(staleness, available + ["training/staleness"]) == [
        "training/staleness",
        "async/buffered",
    ]


def test_cli_report_names_the_files(tmp_path, capsys):
    _write_metrics(tmp_path, num_steps=2)
    assert main(["report", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.split()
    assert str(tmp_path / "report" / "reward.png") in printed
    assert all((tmp_path / "report").joinpath(p.split("/")[-1]).is_file() for p in printed)


def test_cli_report_without_metrics_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "metrics.jsonl not found" in err


def test_a_failed_drawing_is_one_logged_line(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert write_report_logged(tmp_path, logging.getLogger("coordinator")) == []
    assert [r.getMessage().splitlines()[0] for r in caplog.records] == [
        r.getMessage() for r in caplog.records
    ]
    assert "run report not drawn: FileNotFoundError" in caplog.text


def test_the_coordinator_cli_does_not_import_matplotlib():
    code = (
        "import sys; import hybridflow.main.coordinator, hybridflow.coordinator.report, "
        "hybridflow.main.coordinator_run; print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
