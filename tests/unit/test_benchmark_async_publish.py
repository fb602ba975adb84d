"""The async publish suite's figures and ratios (pure arithmetic over a run directory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.async_publish.run_benchmark import ratios
from benchmarks.common.figures import run_figures


def _write_run(run_dir: Path, steps: list[tuple[float, float]], syncs: list[float]) -> None:
    """``steps``: (timing_s/step, timing_s/learner_compute) per step; ``syncs``: the wall
    time of each step's publish (its "sync" event)."""
    run_dir.mkdir()
    t, metrics, events = 100.0, [], []
    for i, ((step_s, compute_s), sync_s) in enumerate(zip(steps, syncs, strict=True)):
        t += step_s
        metrics.append(
            {
                "step": i + 1,
                "time": t,
                "timing_s/step": step_s,
                "timing_s/learner_compute": compute_s,
                "timing_s/update_actor": compute_s,
                "timing_s/update_weights": 0.001,
                "timing_s/gen": 0.01,
                "batch/num_samples": 8,
            }
        )
        events.append({"kind": "sync", "start": t - 0.002, "duration_s": sync_s})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    summary = {
        "rollout_idle_ratio": 0.0,
        "learner_idle_ratio": 0.0,
        "reward_start": 0.0,
        "reward_end": 0.0,
        "staleness_histogram": {},
        "num_dropped_stale": 0,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_figures_and_ratios(tmp_path: Path) -> None:
    _write_run(tmp_path / "overlap", [(9.0, 1.0), (0.05, 0.04), (0.05, 0.04)], [5.0, 0.02, 0.02])
    _write_run(tmp_path / "serial", [(9.0, 1.0), (0.06, 0.04), (0.06, 0.04)], [5.0, 0.01, 0.01])
    figures = {n: run_figures(tmp_path / n, warmup_steps=1) for n in ("overlap", "serial")}
    overlap = figures["overlap"]
    assert overlap["mean_step_s"] == pytest.approx(0.05)  # the warm-up step left out
    assert overlap["mean_learner_compute_s"] == pytest.approx(0.04)
    assert overlap["mean_publish_wall_s"] == pytest.approx(0.02)
    got = ratios(figures)
    assert got["overlap_step_over_learner_compute"] == pytest.approx(1.25)
    assert got["serial_step_over_learner_compute"] == pytest.approx(1.5)
    assert got["serial_over_overlap_step_s"] == pytest.approx(1.2)
    # The wall clock per timed step (0.1 s over 2 steps) over the learner's compute.
    assert got["overlap_wall_over_learner_compute"] == pytest.approx(1.25)
    assert ratios({"overlap": overlap}) == pytest.approx(
        {"overlap_step_over_learner_compute": 1.25, "overlap_wall_over_learner_compute": 1.25}
    )
    _write_run(tmp_path / "ahead", [(9.0, 1.0), (0.042, 0.04), (0.042, 0.04)], [5.0, 0.02, 0.02])
    figures["ahead"] = run_figures(tmp_path / "ahead", warmup_steps=1)
    got = ratios(figures)
    assert got["ahead_step_over_learner_compute"] == pytest.approx(1.05)
    assert got["overlap_over_ahead_step_s"] == pytest.approx(0.05 / 0.042)
    assert got["serial_over_ahead_step_s"] == pytest.approx(0.06 / 0.042)
