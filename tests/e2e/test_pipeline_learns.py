"""The seed's §1.1 pipeline, two reward stages (the arith rule and the built-in reward
model), trains the quickstart task through the services and learns; ``to_config()`` run by
``deploy/launch.sh`` is the same run (synchronous and seeded: equal rewards step by step)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow import RLDataPipeline
from hybridflow.coordinator.metrics import read_step_lines

REPO = Path(__file__).resolve().parents[2]
NUM_STEPS = 40


def seed_pipeline() -> RLDataPipeline:
    pipeline = RLDataPipeline(REPO / "deploy" / "configs" / "quickstart.yaml")
    pipeline.add_stage("generate", "builtin:tiny", num_gpus=4)
    pipeline.add_stage("reward", "rule", weight=0.5)
    pipeline.add_stage("reward", "builtin:tiny-rm", num_gpus=2, weight=0.5, sigmoid=True)
    pipeline.add_stage("train", "grpo", num_gpus=8)
    pipeline.set("coordinator.num_steps", NUM_STEPS)
    pipeline.set("coordinator.prompts_per_step", 16)
    pipeline.set("coordinator.save_checkpoint", False)
    pipeline.set("coordinator.progress", False)
    return pipeline


def rows(run_dir: Path) -> list[dict]:
    return read_step_lines(run_dir / "metrics.jsonl")


def test_seed_pipeline_learns_and_its_yaml_is_the_same_run(tmp_path: Path) -> None:
    pipeline = seed_pipeline()
    summary = pipeline.run(tmp_path / "pipeline", timeout_s=900)
    assert summary["num_steps"] == NUM_STEPS
    assert pipeline.notices  # no GPU here: said, not refused
    metrics = rows(tmp_path / "pipeline")
    # Both stages are scored and visible; the combined score is their weighted sum.
    for m in metrics:
        both = 0.5 * m["reward/rule/mean"] + 0.5 * m["reward/rm/mean"]
        assert m["critic/score/mean"] == pytest.approx(both, abs=1e-5)
    rule = [m["reward/rule/mean"] for m in metrics]
    assert statistics.fmean(rule[-10:]) - statistics.fmean(rule[:5]) >= 0.2, rule

    config = tmp_path / "job.yaml"
    pipeline.to_config(config)
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("HYBRIDFLOW_TOKEN", None)
    out = subprocess.run(
        [str(REPO / "deploy" / "launch.sh"), "--config", str(config), "--run-dir",
         str(tmp_path / "yaml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, start_new_session=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    again = rows(tmp_path / "yaml")
    for key in ("critic/score/mean", "reward/rule/mean", "reward/rm/mean", "actor/pg_loss"):
        assert [m[key] for m in again] == pytest.approx([m[key] for m in metrics], rel=1e-6)
